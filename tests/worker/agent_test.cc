// The worker agent's push and fetch over a FakeTransport: two agents in this process (real
// control servers on 127.0.0.1, port 0), each in front of a FakeEngineAdapter. Every fallback
// path is driven on purpose - holder gone, /kv/info failing or refused, push refused, put
// failing, put timing out with its bytes arriving late, checksum mismatch, partial run, lost
// completion notice, lease expiry - and each transport operation of a fetch is failed, delayed
// and corrupted in turn (n = 1, 2, ... until the fetch takes fewer operations). Whatever
// happens, the engine hears exactly one outcome and then one release within the deadline (or,
// while a write may still arrive, not before it arrived), every pin is undone, and no byte lands
// in a block the engine got back.
#include "worker/agent.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>

#include "common/http_client.h"
#include "common/http_server.h"
#include "common/process.h"
#include "common/strings.h"
#include "tests/worker/agent_fixture.h"
#include "transport/base64.h"

namespace kvf::worker {
namespace {

using namespace agent_testing;  // NOLINT: the fixture's vocabulary

TEST_F(AgentTest, MovesTheRunByteForByteAndUnpins) {
  Node& c = node("C");
  Node& d = node("D");
  holdOn(c, 8);
  auto r = fetch(d, c.agent->url(), "f1", 8, kAmple);
  ASSERT_TRUE(r.released);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_FALSE(r.failed);
  EXPECT_EQ(r.completed->landed, 8u);
  EXPECT_EQ(r.completed->bytes, 8 * kBlockBytes);
  EXPECT_TRUE(r.completed->reason.empty()) << r.completed->reason;
  EXPECT_TRUE(d.engine->markersIntact());  // the taken blocks hold their hashes' content
  EXPECT_TRUE(waitPinsZero(c, kAmple));
  expectNoViolations(d, r);
  EXPECT_EQ(fabric_->bytesWritten(), 8 * kBlockBytes);
}

TEST_F(AgentTest, PartialRunLandsTheLeadingBlocks) {
  Node& c = node("C");
  Node& d = node("D");
  holdOn(c, 5);
  auto r = fetch(d, c.agent->url(), "f1", 8, kAmple);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_EQ(r.completed->landed, 5u);
  EXPECT_EQ(r.completed->reason, "source held 5 of 8 blocks");
  EXPECT_TRUE(r.released);
  EXPECT_TRUE(d.engine->markersIntact());
  expectNoViolations(d, r);
}

TEST_F(AgentTest, HolderHoldingNothingFallsBackAtOnce) {
  Node& c = node("C");
  Node& d = node("D");
  auto r = fetch(d, c.agent->url(), "f1", 8, kAmple);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_TRUE(r.failed);
  EXPECT_EQ(r.completed->reason, "source holds none of the blocks");
  EXPECT_FALSE(r.completed->writes_may_arrive);
  EXPECT_LT(secondsSinceFetch(), kAmple.count() / 2000.0);  // at once, not at the deadline
  expectNoViolations(d, r);
}

TEST_F(AgentTest, HolderGoneFallsBackWithinTheDeadline) {
  Node& d = node("D");
  auto port = pickFreePort();  // nobody listens there
  ASSERT_TRUE(port.ok());
  // The refused connection, not the deadline, ends the fetch: the reason names the source.
  auto r = fetch(d, "http://127.0.0.1:" + std::to_string(*port), "f1", 4, kAmple);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_TRUE(r.failed);
  EXPECT_NE(r.completed->reason.find("source worker"), std::string::npos) << r.completed->reason;
  EXPECT_FALSE(r.completed->writes_may_arrive);
  EXPECT_LT(secondsSinceFetch(), kAmple.count() / 2000.0);
  EXPECT_TRUE(d.engine->markersIntact());
  expectNoViolations(d, r);
}

TEST_F(AgentTest, InfoRefusedOrFailingFallsBack) {
  Node& c = node("C", "other-token");  // D's token is refused: 401
  Node& d = node("D");
  holdOn(c, 4);
  auto refused = fetch(d, c.agent->url(), "f1", 4, kAmple);
  ASSERT_TRUE(refused.completed.has_value());
  EXPECT_NE(refused.completed->reason.find("GET /kv/info: HTTP 401"), std::string::npos)
      << refused.completed->reason;
  // A server that answers /kv/info with 500.
  auto server = io_->run([&]() -> asio::awaitable<std::unique_ptr<http::HttpServer>> {
    auto s = http::HttpServer::create(io_->context(), http::ServerOptions{});
    (*s)->route("GET", "/kv/info",
                [](const http::Request&, http::ResponseWriter& w) -> asio::awaitable<void> {
                  co_await w.sendError(500, "broken");
                });
    (*s)->start();
    co_return std::move(*s);
  });
  auto failing = fetch(d, "http://127.0.0.1:" + std::to_string(server->port()), "f2", 4, kAmple);
  ASSERT_TRUE(failing.completed.has_value());
  EXPECT_NE(failing.completed->reason.find("GET /kv/info: HTTP 500"), std::string::npos)
      << failing.completed->reason;
  EXPECT_TRUE(d.engine->markersIntact());
  expectNoViolations(d, failing);
  runOnIo([&] { server->stop(); });
}

// A server that speaks for holder C on /kv/info (so the receiver expects C's writes) but answers
// /kv/push with `status`; with `claim` it first claims the landing on the receiver, as a holder
// that goes on to write would.
std::unique_ptr<http::HttpServer> impostor(asio::io_context& ioc, int status, bool claim = false) {
  auto s = http::HttpServer::create(ioc, http::ServerOptions{});
  (*s)->route("GET", "/kv/info",
              [](const http::Request&, http::ResponseWriter& w) -> asio::awaitable<void> {
                protocol::WorkerInfo info{"C", transport::base64Encode("fake:C"), "fake",
                                          kBlockSize, kBlockBytes};
                std::string body = protocol::serializeWorkerInfo(info);
                co_await w.sendJson(200, std::move(body));
              });
  (*s)->route("POST", "/kv/push",
              [status, claim, &ioc](const http::Request& r,
                                    http::ResponseWriter& w) -> asio::awaitable<void> {
                auto push = protocol::parsePushRequest(r.body, {});
                if (claim && push.ok()) {
                  const std::string& url = push->receiver_url;
                  auto port = static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
                  auto client = http::HttpClient::create(ioc.get_executor(), "127.0.0.1", port,
                                                         http::ClientOptions{});
                  http::ClientRequest req;
                  req.method = "POST";
                  req.target = "/kv/claim";
                  req.body = protocol::serializeLandingClaim({push->landing_id});
                  req.headers.emplace_back("authorization", "Bearer s3cret");
                  auto granted = co_await client->request(std::move(req));
                  EXPECT_TRUE(granted.ok() && granted->status == 200);
                }
                co_await w.sendError(status, "not now");
              });
  (*s)->start();
  return std::move(*s);
}

TEST_F(AgentTest, PushRefusedBeforeAnyPutFreesTheLandingAtOnce) {
  node("C");
  Node& d = node("D");
  auto server = io_->run([&]() -> asio::awaitable<std::unique_ptr<http::HttpServer>> {
    co_return impostor(io_->context(), 409);
  });
  auto r = fetch(d, "http://127.0.0.1:" + std::to_string(server->port()), "f1", 4, kAmple);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_TRUE(r.failed);
  EXPECT_NE(r.completed->reason.find("HTTP 409"), std::string::npos) << r.completed->reason;
  EXPECT_FALSE(r.completed->writes_may_arrive);             // 4xx: the holder posted nothing
  EXPECT_LT(secondsSinceFetch(), kAmple.count() / 2000.0);  // at once, not at the deadline
  expectNoViolations(d, r);
  runOnIo([&] { server->stop(); });
}

TEST_F(AgentTest, PushFailingAfterItMayHavePostedQuarantinesUntilTheHolderIsGone) {
  node("C");
  Node& d = node("D");
  auto server = io_->run([&]() -> asio::awaitable<std::unique_ptr<http::HttpServer>> {
    co_return impostor(io_->context(), 503, /*claim=*/true);
  });
  // The landing's 200 ms deadline ends the fetch; 800 ms more show no release before C goes.
  auto r = fetch(d, "http://127.0.0.1:" + std::to_string(server->port()), "f1", 4,
                 milliseconds(200), milliseconds(800));
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_TRUE(r.failed);
  EXPECT_TRUE(r.completed->writes_may_arrive);  // 5xx: C may have posted a put
  EXPECT_FALSE(r.released);                     // quarantined: C is alive
  fabric_->kill("C");
  r = d.engine->waitReleased("f1", kAmple);
  EXPECT_TRUE(r.released);
  expectNoViolations(d, r);
  runOnIo([&] { server->stop(); });
}

// A holder writes only after the receiver granted its claim: a source that failed without
// claiming can have written nothing, so its landing is freed at once instead of quarantined
// until that source exits (a fake source could otherwise hold landing blocks indefinitely).
TEST_F(AgentTest, UnclaimedLandingIsFreedAtOnceWhateverTheSourceAnswers) {
  node("C");
  Node& d = node("D");
  auto server = io_->run([&]() -> asio::awaitable<std::unique_ptr<http::HttpServer>> {
    co_return impostor(io_->context(), 503);
  });
  auto r = fetch(d, "http://127.0.0.1:" + std::to_string(server->port()), "f1", 4, kAmple);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_TRUE(r.failed);
  EXPECT_FALSE(r.completed->writes_may_arrive);
  EXPECT_TRUE(r.released);
  expectNoViolations(d, r);
  runOnIo([&] { server->stop(); });
}

// A token holder asks C to push into D's live pool blocks with D's real address and key but a
// landing D never opened. C claims the landing from D first; D refuses; C writes nothing.
TEST_F(AgentTest, PushNamingNoOutstandingLandingIsRefusedBeforeAnyWrite) {
  Node& c = node("C");
  Node& d = node("D");
  holdOn(c, 4);
  const PayloadRegion pool = d.engine->payloadRegion();
  const auto* bytes = static_cast<const std::byte*>(pool.data);
  const std::vector<std::byte> before(bytes, bytes + pool.length);
  protocol::PushRequest push;
  push.request_id = "hostile";
  push.receiver_url = d.agent->url();
  push.block_hashes = hashes(4);
  push.receiver_address = transport::base64Encode(d.agent->transport().workerAddress());
  push.rkey = transport::base64Encode(
      strCat("rkey:D:", reinterpret_cast<uintptr_t>(pool.data)));  // FakeFabric's key format
  for (size_t i = 0; i < 4; ++i) {
    push.block_addrs.push_back(reinterpret_cast<uintptr_t>(pool.data) + (10 + i) * kBlockBytes);
  }
  push.block_bytes = kBlockBytes;
  push.landing_id = 0x5eed5eed5eedULL;
  auto answer = io_->run([&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
    auto client = http::HttpClient::create(io_->context().get_executor(), "127.0.0.1",
                                           c.agent->port(), http::ClientOptions{});
    http::ClientRequest req;
    req.method = "POST";
    req.target = "/kv/push";
    req.body = protocol::serializePushRequest(push);
    req.headers.emplace_back("authorization", "Bearer s3cret");
    co_return co_await client->request(std::move(req));
  });
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->status, 400) << answer->body;
  EXPECT_NE(answer->body.find("is not an outstanding landing"), std::string::npos) << answer->body;
  EXPECT_TRUE(std::equal(before.begin(), before.end(), bytes)) << "D's pool was written";
  EXPECT_TRUE(waitPinsZero(c, kAmple));
}

TEST_F(AgentTest, ChecksumMismatchFallsBackAndFreesTheLanding) {
  Node& c = node("C");
  Node& d = node("D");
  // Operations: expect@D, post@C, write@C (corrupted), notice@C.
  auto r = faultedFetch(c, d, 4, 3, Fault::kCorrupt, {}, kAmple, kAmple);
  ASSERT_EQ(fabric_->operationLog().at(2), "write@C");
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_TRUE(r.failed);
  EXPECT_NE(r.completed->reason.find("checksum mismatch"), std::string::npos)
      << r.completed->reason;
  EXPECT_FALSE(r.completed->writes_may_arrive);  // the notice came: nothing more will land
  EXPECT_TRUE(d.engine->markersIntact());
  EXPECT_TRUE(waitPinsZero(c, kAmple));
  expectNoViolations(d, r);
}

TEST_F(AgentTest, PutTimingOutQuarantinesUntilItsLateWritesLanded) {
  Node& c = node("C");
  Node& d = node("D");
  // The bytes (write@C) arrive 2.5 s late, long after D's 200 ms deadline; the fixture waits
  // for the outcome, then 300 ms more show no release while the write is on its way.
  auto r = faultedFetch(c, d, 6, 3, Fault::kDelay, milliseconds(2500), milliseconds(200),
                        milliseconds(300));
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_TRUE(r.failed);
  EXPECT_TRUE(r.completed->writes_may_arrive);
  EXPECT_FALSE(r.released) << "released while the late write was still on its way";
  EXPECT_EQ(fabric_->bytesWritten(), 0u);
  EXPECT_LT(r.completed->elapsed, kBound);  // the engine fell back long before the write
  r = d.engine->waitReleased("f1", kAmple);
  EXPECT_TRUE(r.released);
  ASSERT_TRUE(fabric_->waitIdle(kAmple));
  EXPECT_EQ(fabric_->bytesWritten(), 6 * kBlockBytes);  // they did land, before the release
  EXPECT_TRUE(d.engine->markersIntact());
  EXPECT_TRUE(waitPinsZero(c, kAmple));
  expectNoViolations(d, r);
}

TEST_F(AgentTest, LostCompletionNoticeQuarantinesUntilTheHolderIsGone) {
  Node& c = node("C");
  Node& d = node("D");
  // notice@C fails: the bytes landed, the notice did not.
  auto r = faultedFetch(c, d, 4, 4, Fault::kFail, {}, milliseconds(200), milliseconds(600));
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_TRUE(r.failed);
  EXPECT_TRUE(r.completed->writes_may_arrive);
  EXPECT_FALSE(r.released);
  fabric_->kill("C");
  r = d.engine->waitReleased("f1", kAmple);
  EXPECT_TRUE(r.released);
  EXPECT_TRUE(d.engine->markersIntact());
  expectNoViolations(d, r);
}

// Beast-style: fail, delay past the deadline, or corrupt the n-th transport operation of one
// fetch, for every n the fetch reaches.
TEST_F(AgentTest, EveryTransportOperationFailingEndsInOneOutcomeAndOneRelease) {
  everyOperationFaulted(
      [&]() -> Node& {
        Node& c = node("C");
        holdOn(c, 8);
        return c;
      },
      8, 4);  // expect, post, write, notice
}

TEST_F(AgentTest, LeasesPinUntilExpiryOrThePushThatNamesThem) {
  Node& c = node("C");
  Node& d = node("D");
  holdOn(c, 6);
  c.engine->setClock(0);
  auto run = c.engine->onEngine([&] { return c.agent->holdLease("l1", hashes(8), 100); });
  EXPECT_EQ(run.size(), 6u);  // the leading cached run
  EXPECT_EQ(c.engine->totalPins(), 6u);
  EXPECT_EQ(c.agent->leaseCount(), 1u);
  std::this_thread::sleep_for(milliseconds(60));
  EXPECT_EQ(c.engine->totalPins(), 6u);  // not due on the engine clock
  c.engine->setClock(101);
  EXPECT_TRUE(waitPinsZero(c, kAmple));
  EXPECT_EQ(c.agent->leaseCount(), 0u);
  // A lease that a push names is released after that push.
  c.engine->onEngine([&] { return c.agent->holdLease("l2", hashes(4), 1'000'000'000); });
  EXPECT_EQ(c.engine->totalPins(), 4u);
  auto r = fetch(d, c.agent->url(), "f1", 4, kAmple, kAmple, "l2");
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_EQ(r.completed->landed, 4u);
  EXPECT_TRUE(waitPinsZero(c, kAmple));
  EXPECT_EQ(c.agent->leaseCount(), 0u);
}

TEST_F(AgentTest, MalformedFetchesFallBackWithTheReason) {
  Node& c = node("C");
  Node& d = node("D");
  RemoteKvFetch f;
  f.id = "bad";
  f.source = c.agent->url();
  f.hashes = hashes(3);
  f.blocks = {41, 42};
  d.engine->expectFetch("bad", f.hashes, f.blocks);
  d.agent->fetch(f);
  auto r = d.engine->waitReleased("bad", kAmple);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_NE(r.completed->reason.find("3 hashes for 2 landing blocks"), std::string::npos);
  f.id = "outside";
  f.hashes = hashes(1);
  f.blocks = {static_cast<BlockIndex>(kBlocks)};
  d.engine->expectFetch("outside", f.hashes, {});
  d.agent->fetch(f);
  r = d.engine->waitReleased("outside", kAmple);
  ASSERT_TRUE(r.completed.has_value());
  EXPECT_NE(r.completed->reason.find("outside the pool"), std::string::npos);
}

TEST(AgentCreateTest, RegistrationFailureIsAnError) {
  FakeFabric fabric;
  FakeEngineAdapter engine(kBlockSize, kBlockBytes, kBlocks);
  testing::IoThread io;
  fabric.inject(1, Fault::kFail);
  AgentOptions o;
  o.token = "t";
  auto agent = io.run([&]() -> asio::awaitable<absl::StatusOr<std::unique_ptr<WorkerAgent>>> {
    co_return WorkerAgent::create(io.context(), engine, fabric.context("C"), o, nullptr);
  });
  EXPECT_FALSE(agent.ok());
  EXPECT_NE(agent.status().message().find("register"), std::string::npos) << agent.status();
}

// Without a token anyone who reaches the port could write into the engine's KV memory: the
// agent refuses to run open unless told so explicitly.
TEST(AgentCreateTest, RefusesToRunWithoutATokenUnlessInsecure) {
  FakeFabric fabric;
  FakeEngineAdapter engine(kBlockSize, kBlockBytes, kBlocks);
  testing::IoThread io;
  auto create = [&](AgentOptions o, const char* name) {
    return io.run([&]() -> asio::awaitable<absl::StatusOr<std::unique_ptr<WorkerAgent>>> {
      co_return WorkerAgent::create(io.context(), engine, fabric.context(name), o, nullptr);
    });
  };
  auto open = create(AgentOptions{}, "A");
  ASSERT_FALSE(open.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(open.status()));
  EXPECT_NE(open.status().message().find("token"), std::string::npos) << open.status();
  AgentOptions insecure;
  insecure.insecure = true;
  auto explicit_open = create(insecure, "B");
  EXPECT_TRUE(explicit_open.ok()) << explicit_open.status();
}

}  // namespace
}  // namespace kvf::worker
