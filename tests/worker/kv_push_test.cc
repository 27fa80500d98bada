// Multi-process KV push: real kvf-engine processes on 127.0.0.1 (self-picked ports, killed at
// the end) push blocks to each other through the worker control server and UCX. Checks the
// happy path (cached_tokens, bytes, later local hits, leases) and the fault paths (holder
// evicted, corrupted, stalled, killed): each request completes through fallback within its
// deadline + 100 ms (+ the modelled prefill at time_scale 50), and nothing hangs.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>

#include <boost/json.hpp>

#include "common/http_client.h"
#include "common/json.h"
#include "common/process.h"
#include "protocol/transfer_auth.h"
#include "tests/testing/child_process.h"
#include "tests/testing/io_thread.h"
#include "tests/testing/socket_read.h"

namespace kvf::testing {
namespace {

namespace fs = std::filesystem;
namespace bj = boost::json;
using Clock = std::chrono::steady_clock;

constexpr int kAmpleDeadlineMs = 20'000;
// How long a poll for what must happen waits: a loaded machine always gets there by then.
constexpr std::chrono::milliseconds kAmpleWait{kAmpleDeadlineMs};
// The bound on a fallback whose short deadline is under test: it only catches a fetch that
// ignores its deadline (never a timing test), so a loaded machine has several seconds past it.
constexpr double kDeadlineSlackSeconds = 4.0;

struct Engine {
  std::unique_ptr<Process> proc;
  int port = 0;
  int worker_port = 0;
  std::string workerUrl() const { return "http://127.0.0.1:" + std::to_string(worker_port); }
};

class KvPushTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = envOr("KVF_SOURCE_DIR", fs::current_path().string());
    bin_ = envOr("KVF_BIN_DIR", source_ + "/build/bin");
    dir_ = fs::temp_directory_path() /
           ("kvf_push_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    for (auto& e : engines_) e->proc->kill();
    io_.stop();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Starts an engine; `worker_extra` is appended to its worker: {...} mapping; `link_gbps`
  // replaces the profile's link bandwidth; `cache` is its cache (and tiers) configuration.
  Engine& start(const std::string& name, const std::string& worker_extra = "", int link_gbps = 200,
                int time_scale = 50,
                const std::string& cache = "cache: {block_size: 16, num_gpu_blocks: 4000}\n") {
    auto e = std::make_unique<Engine>();
    auto worker_port = pickFreePort();
    EXPECT_TRUE(worker_port.ok()) << worker_port.status();
    e->worker_port = worker_port.value_or(0);
    fs::path profile = dir_ / (name + "-profile.yaml");
    std::string text = readFile(source_ + "/engine/profiles/qwen3-coder-30b-a3b-h20.yaml");
    size_t at = text.find("bandwidth_gbps: 200");
    EXPECT_NE(at, std::string::npos);
    text.replace(at, 19, "bandwidth_gbps: " + std::to_string(link_gbps));
    std::ofstream(profile) << text;
    fs::path config = dir_ / (name + ".yaml");
    std::ofstream(config) << "instance_id: " << name << "\nport: 0\n"
                          << "profile: " << profile.string() << "\n"
                          << "time_scale: " << time_scale << "\nmax_model_len: 32768\n"
                          << cache << "kv_events: {enabled: false}\n"
                          << "worker: {token: s3cret" << worker_extra << "}\n";
    e->proc = startLogged({bin_ + "/kvf-engine", "--config", config.string(), "--worker_port",
                           std::to_string(e->worker_port)},
                          (dir_ / (name + ".log")).string());
    EXPECT_TRUE(waitForLog(*e->proc, "kvf-engine ready", std::chrono::seconds(20)))
        << readLog(*e->proc);
    e->port = std::stoi(logValue(*e->proc, "kvf-engine ready", "port"));
    engines_.push_back(std::move(e));
    return *engines_.back();
  }

  // The x-kvf-transfer-auth header the router would send with `body`'s kv_transfer_params
  // (signed under the cluster token "s3cret"), or "" when it has none.
  static std::string routerSignature(const std::string& body, const std::string& request_id,
                                     const std::string& key = "s3cret") {
    auto o = json::parseObject(body);
    if (!o.ok() || !o->contains("kv_transfer_params")) return {};
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    return protocol::signKvTransfer(protocol::transferAuthKey(key), o->at("kv_transfer_params"),
                                    request_id, now_ms, protocol::randomNonce());
  }

  // POSTs to /v1/* carry the router's signature on their kv_transfer_params unless `headers`
  // is given (then exactly those are sent).
  http::Response call(int port, std::string method, std::string target, std::string body = {},
                      std::string token = {}, std::optional<http::Headers> headers = std::nullopt) {
    return io_.run([&]() -> asio::awaitable<http::Response> {
      auto client =
          http::HttpClient::create(io_.executor(), "127.0.0.1", static_cast<uint16_t>(port));
      http::ClientRequest req;
      req.method = method;
      req.target = target;
      req.body = body;
      if (headers) {
        req.headers = *headers;
      } else if (method == "POST" && target.starts_with("/v1/")) {
        std::string id = "test-" + std::to_string(next_request_++);
        req.headers.emplace_back("x-request-id", id);
        if (std::string sig = routerSignature(body, id); !sig.empty()) {
          req.headers.emplace_back(std::string(protocol::kTransferAuthHeader), sig);
        }
      }
      if (!token.empty()) req.headers.emplace_back("authorization", "Bearer " + token);
      auto r = co_await client->request(std::move(req));
      EXPECT_TRUE(r.ok()) << r.status();
      co_return r.ok() ? *r : http::Response{};
    });
  }

  // POST /v1/completions; returns the body and the wall time it took.
  bj::object complete(const Engine& e, const std::string& prompt, const std::string& extra,
                      double* seconds = nullptr) {
    std::string body = R"({"prompt": )" + prompt + R"(, "max_tokens": 2)" + extra + "}";
    auto t0 = Clock::now();
    http::Response r = call(e.port, "POST", "/v1/completions", body);
    if (seconds) *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_EQ(r.status, 200) << r.body;
    auto o = json::parseObject(r.body);
    EXPECT_TRUE(o.ok()) << r.body;
    return o.ok() ? *o : bj::object{};
  }

  // The first sample of `name` whose labels include `label` (e.g. tier="cpu"), or -1.
  double metric(const Engine& e, const std::string& name, const std::string& label = "") {
    std::string text = call(e.port, "GET", "/metrics").body;
    size_t at = text.find("\n" + name);
    while (!label.empty() && at != std::string::npos &&
           text.substr(at, text.find('\n', at + 1) - at).find(label) == std::string::npos) {
      at = text.find("\n" + name, at + 1);
    }
    if (at == std::string::npos) return -1;
    size_t space = text.find(' ', text.find('}', at));
    return std::stod(text.substr(space + 1, text.find('\n', space + 1) - space - 1));
  }

  // Polls a metric until it equals `want` or `timeout` passes.
  bool waitMetric(const Engine& e, const std::string& name, double want,
                  std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (metric(e, name) == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static std::string tokens(int n, int salt) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(1000 + (i * 7 + salt) % 9000);
    return s + "]";
  }
  // kv_transfer_params naming `c` as the source. The default deadline is long enough for a
  // loaded machine (the engine's own default, the modelled transfer + 100 ms, is not: a first
  // push between two engines also learns the peer and opens its endpoint): a test that checks
  // what moves must not fall back because the machine is busy. Tests of the deadline pass one.
  static std::string source(const Engine& c, int deadline_ms = kAmpleDeadlineMs) {
    return R"(, "kv_transfer_params": {"source": ")" + c.workerUrl() + R"(", "deadline_ms": )" +
           std::to_string(deadline_ms) + "}";
  }
  static int64_t cached(bj::object& o) {
    return o["usage"].as_object()["prompt_tokens_details"].as_object()["cached_tokens"].as_int64();
  }
  static bj::object& result(bj::object& o) { return o["kv_transfer_result"].as_object(); }

  std::string source_, bin_;
  int next_request_ = 0;
  fs::path dir_;
  IoThread io_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

TEST_F(KvPushTest, PushedPrefixIsCachedOnTheReceiverAndHitsLocallyLater) {
  Engine& c = start("C");
  Engine& d = start("D");
  std::string prefix = tokens(4000, 1);  // 250 full blocks on C
  complete(c, prefix, "");
  std::string turn2 = tokens(4100, 1);  // the prefix + 100 new tokens
  bj::object r = complete(d, turn2, source(c));
  EXPECT_EQ(std::string(result(r)["status"].as_string()), "partial") << r;  // C has 250 of 256
  EXPECT_EQ(result(r)["pushed_tokens"].as_int64(), 4000);
  EXPECT_EQ(result(r)["pushed_bytes"].as_int64(), 250 * 256);
  EXPECT_EQ(cached(r), 4000);
  // The bytes C sent are the bytes D used (D verified each block's content and checksum).
  EXPECT_EQ(metric(c, "kvfabric_worker_push_sent_bytes_total"), 250 * 256);
  EXPECT_EQ(metric(d, "kvfabric_engine_kv_push_received_bytes_total"), 250 * 256);
  EXPECT_EQ(metric(d, "kvfabric_transport_checksum_mismatches_total"), 0);
  // Later requests hit the migrated blocks (and the ones D computed) locally.
  bj::object again = complete(d, turn2, "");
  EXPECT_EQ(cached(again), 4096);
  EXPECT_FALSE(again.contains("kv_transfer_result"));
  // A full run present on C: status ok.
  bj::object same = complete(start("E"), prefix, source(c));
  EXPECT_EQ(std::string(result(same)["status"].as_string()), "ok") << same;
  EXPECT_EQ(cached(same), 3984);  // the last token is always computed
  // The peer's worker URL stays inside the cluster: a receiver does not echo its params.
  EXPECT_FALSE(same.contains("kv_transfer_params")) << same;
  // Streaming: the result rides on the final chunk.
  std::string body = R"({"prompt": )" + tokens(2000, 21) + R"(, "max_tokens": 3, "stream": true)" +
                     source(c) + "}";
  complete(c, tokens(2000, 21), "");
  std::string sse = call(d.port, "POST", "/v1/completions", body).body;
  size_t at = sse.find("kv_transfer_result");
  ASSERT_NE(at, std::string::npos) << sse;
  EXPECT_EQ(sse.find("kv_transfer_params"), std::string::npos) << sse;
  EXPECT_NE(sse.find(R"("status":"ok")", at), std::string::npos) << sse;
  size_t finish = sse.find("finish_reason\":\"length");
  ASSERT_NE(finish, std::string::npos) << sse;
  EXPECT_EQ(sse.find("\n", finish), sse.find("\n", at));  // the same (final) chunk
  // Unauthenticated control requests are refused.
  EXPECT_EQ(call(c.worker_port, "GET", "/kv/info").status, 401);
  EXPECT_EQ(call(c.worker_port, "GET", "/kv/info", "", "s3cret").status, 200);
  EXPECT_EQ(call(c.worker_port, "POST", "/kv/push", "{}", "s3cret").status, 400);
}

// C's pool keeps the head of a prefix, its host-memory tier the tail the pool evicted: the push
// serves both, in one landing, and D uses every block (checked against its hash).
TEST_F(KvPushTest, PrefixHalfInThePoolHalfInHostMemoryIsPushedWhole) {
  Engine& c = start("C", "", 200, 50,
                    "cache: {block_size: 16, num_gpu_blocks: 64}\n"
                    "tiers: {host: {capacity_mib: 1, pin: off}}\n");
  Engine& d = start("D");
  std::string prefix = tokens(640, 5);  // 40 full blocks
  complete(c, prefix, "");
  complete(c, tokens(640, 77), "");  // evicts the prefix's tail (freed first) into host memory
  std::string turn2 = tokens(740, 5);
  bj::object r = complete(d, turn2, source(c));
  EXPECT_EQ(result(r)["pushed_tokens"].as_int64(), 640) << r;
  EXPECT_EQ(cached(r), 640);
  const double gpu = metric(c, "kvfabric_worker_push_blocks_total", "tier=\"gpu\"");
  const double cpu = metric(c, "kvfabric_worker_push_blocks_total", "tier=\"cpu\"");
  EXPECT_GT(gpu, 0);
  EXPECT_GT(cpu, 0);
  EXPECT_EQ(gpu + cpu, 40);
  EXPECT_EQ(metric(c, "kvfabric_worker_push_blocks_total", "tier=\"disk\""), 0);
  EXPECT_EQ(metric(d, "kvfabric_engine_kv_push_verified_blocks_total"), 40);
  EXPECT_EQ(metric(d, "kvfabric_engine_kv_push_corrupt_blocks_total"), 0);
  EXPECT_EQ(metric(d, "kvfabric_transport_checksum_mismatches_total"), 0);
  EXPECT_EQ(metric(d, "kvfabric_engine_kv_push_received_bytes_total"), 40 * 256);
}

// C's pool keeps the head of a prefix; of the tail it evicted, host memory (16 slots of 64 KiB
// blocks) keeps the most recent and the disk the rest: the push serves all three tiers.
TEST_F(KvPushTest, PrefixAcrossPoolHostMemoryAndDiskIsPushedWhole) {
  const std::string cache =
      "cache: {block_size: 16, num_gpu_blocks: 64, "
      "payload_bytes_per_block: 65536}\n";
  Engine& c = start("C", "", 200, 50,
                    cache + "tiers: {host: {capacity_mib: 1, pin: off}, disk: {dir: " +
                        (dir_ / "disk").string() + ", capacity_mib: 64, file_mib: 4}}\n");
  Engine& d = start("D", "", 200, 50,
                    "cache: {block_size: 16, num_gpu_blocks: 256, payload_bytes_per_block: "
                    "65536}\n");
  std::string prefix = tokens(640, 9);  // 40 full blocks
  complete(c, prefix, "");
  complete(c, tokens(880, 78), "");  // 56 blocks: evicts most of the prefix, tail first
  bj::object r = complete(d, tokens(740, 9), source(c));
  EXPECT_EQ(result(r)["pushed_tokens"].as_int64(), 640) << r;
  EXPECT_EQ(cached(r), 640);
  const double gpu = metric(c, "kvfabric_worker_push_blocks_total", "tier=\"gpu\"");
  const double cpu = metric(c, "kvfabric_worker_push_blocks_total", "tier=\"cpu\"");
  const double disk = metric(c, "kvfabric_worker_push_blocks_total", "tier=\"disk\"");
  EXPECT_GT(gpu, 0);
  EXPECT_GT(cpu, 0);
  EXPECT_GT(disk, 0);
  EXPECT_EQ(gpu + cpu + disk, 40);
  EXPECT_EQ(metric(d, "kvfabric_engine_kv_push_verified_blocks_total"), 40);
  EXPECT_EQ(metric(d, "kvfabric_engine_kv_push_corrupt_blocks_total"), 0);
  EXPECT_EQ(metric(d, "kvfabric_engine_kv_push_received_bytes_total"), 40 * 65536);
}

TEST_F(KvPushTest, PushCostsTheModelledLinkTimeOverlappedLayerByLayer) {
  // At 10 Gbps, 4000 tokens x 96 KiB take 314.6 ms + 50 us (modelled) - far longer than the
  // 16-token step that follows, so the step ends at the transfer's end + one layer's share.
  // Time scale 1: wall-clock hiccups of a loaded machine are not magnified in modelled time.
  Engine& c = start("C", "", 10, 1);
  Engine& d = start("D", "", 10, 1);
  Engine& w = start("W", ", layerwise: false", 10, 1);
  // Three fresh prefixes per receiver; the fastest trial is compared, so a wake-up delay of a
  // loaded machine (ctest runs tests in parallel) cannot fail the upper bounds.
  std::vector<double> ttfts;
  for (Engine* e : {&d, &w}) {
    double best = 1e9;
    for (int trial = 0; trial < 3; ++trial) {
      int salt = 9 + 100 * trial + (e == &w ? 1000 : 0);
      complete(c, tokens(4000, salt), "");
      double before = metric(*e, "vllm:time_to_first_token_seconds_sum");
      bj::object r = complete(*e, tokens(4016, salt), source(c, 2000));
      EXPECT_EQ(result(r)["pushed_tokens"].as_int64(), 4000) << r;
      double ttft = metric(*e, "vllm:time_to_first_token_seconds_sum") - before;
      EXPECT_GE(ttft, 0.3146);  // the modelled link time is always paid
      best = std::min(best, ttft);
    }
    EXPECT_LT(best, 0.3146 + 0.08) << (e == &d ? "layerwise" : "whole transfer first");
    ttfts.push_back(best);
  }
  // Layer-wise, only 1/48 of the ~36 ms step follows the transfer; otherwise all of it.
  EXPECT_LT(ttfts[0], ttfts[1] - 0.02);
}

TEST_F(KvPushTest, OffloadLeaseIsPushedThenReleasedOrExpires) {
  Engine& p = start("P");
  Engine& d = start("D");
  std::string prompt = tokens(2000, 2);
  bj::object pre = complete(p, prompt, R"(, "kv_transfer_params": {"do_remote_decode": true})");
  ASSERT_TRUE(pre.contains("kv_transfer_params")) << pre;
  bj::object params = pre["kv_transfer_params"].as_object();
  EXPECT_EQ(params["block_hashes"].as_array().size(), 125u);
  EXPECT_EQ(pre["usage"].as_object()["completion_tokens"].as_int64(), 1);
  EXPECT_EQ(metric(p, "kvfabric_engine_kv_push_leases"), 1);
  std::string extra = R"(, "kv_transfer_params": )" + bj::serialize(params);
  bj::object r = complete(d, prompt, extra);
  EXPECT_EQ(std::string(result(r)["status"].as_string()), "ok") << r;
  EXPECT_EQ(cached(r), 124 * 16);  // (2000 - 1) / 16 full blocks
  EXPECT_TRUE(waitMetric(p, "kvfabric_engine_kv_push_leases", 0, kAmpleWait));
  // Streamed, the lease rides on the final chunk. Each lease below lives 3 s: long enough that
  // a loaded machine still sees it held, short enough to watch it expire.
  std::string streamed =
      R"({"prompt": )" + tokens(300, 4) +
      R"(, "stream": true, "kv_transfer_params": {"do_remote_decode": true, "lease_ms": 3000}})";
  std::string sse = call(p.port, "POST", "/v1/completions", streamed).body;
  EXPECT_NE(sse.find("\"lease_id\""), std::string::npos) << sse;
  EXPECT_TRUE(waitMetric(p, "kvfabric_engine_kv_push_leases", 1, kAmpleWait));
  ASSERT_EQ(call(p.port, "POST", "/reset_prefix_cache").status, 409);  // pinned by the lease
  EXPECT_TRUE(waitMetric(p, "kvfabric_engine_kv_push_leases", 0, kAmpleWait));
  // An unused lease expires and frees the blocks.
  complete(p, tokens(800, 3),
           R"(, "kv_transfer_params": {"do_remote_decode": true, "lease_ms": 3000})");
  EXPECT_EQ(metric(p, "kvfabric_engine_kv_push_leases"), 1);
  EXPECT_TRUE(waitMetric(p, "kvfabric_engine_kv_push_leases", 0, kAmpleWait));
}

// A token holder asks holder C to push C's leased blocks into receiver D at address 4096 with a
// crafted key and a landing D never opened: before, C unpacked the key in UCX and put to the
// address (a segfault); now C claims the landing from D, D refuses, and C writes nothing.
TEST_F(KvPushTest, HostilePushNeverReachesUcxAndBothEnginesKeepServing) {
  Engine& c = start("C");
  Engine& d = start("D");
  std::string prompt = tokens(2000, 31);
  bj::object pre = complete(c, prompt, R"(, "kv_transfer_params": {"do_remote_decode": true})");
  ASSERT_TRUE(pre.contains("kv_transfer_params")) << pre;
  bj::array held = pre["kv_transfer_params"].as_object()["block_hashes"].as_array();
  auto info = json::parseObject(call(d.worker_port, "GET", "/kv/info", "", "s3cret").body);
  ASSERT_TRUE(info.ok());
  bj::object push;
  push["request_id"] = "hostile";
  push["receiver_url"] = d.workerUrl();
  push["receiver_address"] = (*info)["transport_address"];
  push["rkey"] = "S0ZSSwEAAAAAEAAAAAAAAP////8AAAAA/////w==";  // crafted: UCX would trust it
  push["block_hashes"] = bj::array{held[0]};
  push["block_addrs"] = bj::array{4096};
  push["block_bytes"] = 256;
  push["landing_id"] = 77;
  http::Response r = call(c.worker_port, "POST", "/kv/push", bj::serialize(push), "s3cret");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("is not an outstanding landing"), std::string::npos) << r.body;
  std::string refused = call(c.port, "GET", "/metrics").body;
  EXPECT_NE(refused.find(R"(reason="not_granted"} 1)"), std::string::npos);
  std::string claims = call(d.port, "GET", "/metrics").body;
  EXPECT_NE(claims.find(R"(kvfabric_worker_claims_refused_total{model_name)"), std::string::npos);
  EXPECT_NE(claims.find(R"(reason="unknown"} 1)"), std::string::npos);
  // Both engines keep serving, and an honest push between them still lands.
  bj::object ok = complete(d, prompt, source(c));
  EXPECT_EQ(std::string(result(ok)["status"].as_string()), "ok") << ok;
  EXPECT_EQ(cached(ok), 124 * 16);
}

// A listening socket that never accepts: what an engine sends it waits in the backlog.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0 && ::listen(fd, 16) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
  }
  ~Listener() { ::close(fd); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
  // Everything received on connections made so far.
  std::string received() {
    std::string all;
    for (int c; (c = ::accept(fd, nullptr, nullptr)) >= 0;) {
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(c, buf, sizeof(buf), MSG_DONTWAIT)) > 0) all.append(buf, n);
      all += "<connection>";
      ::close(c);
    }
    return all;
  }
};

// A client of the engine's public port is not the router: kv_transfer_params it sends are
// refused (403) whether unsigned, signed under another key, or a replay, and the engine never
// contacts the source it named (which would receive the cluster's worker token).
TEST_F(KvPushTest, UnsignedKvTransferParamsAreRefusedAndTheTokenNeverLeaves) {
  Engine& d = start("D");
  Listener evil;
  ASSERT_GT(evil.port, 0);
  const std::string body = R"({"prompt": )" + tokens(600, 9) +
                           R"(, "max_tokens": 2, "kv_transfer_params": {"source": ")" + evil.url() +
                           R"("}})";
  const std::string lease_body =
      R"({"prompt": )" + tokens(600, 10) +
      R"(, "max_tokens": 2, "kv_transfer_params": {"do_remote_decode": true, "lease_ms": 60000}})";
  auto post = [&](const std::string& b, http::Headers h) {
    return call(d.port, "POST", "/v1/completions", b, {}, std::move(h));
  };
  EXPECT_EQ(post(body, {}).status, 403);
  EXPECT_EQ(post(lease_body, {}).status, 403);
  EXPECT_EQ(metric(d, "kvfabric_engine_kv_push_leases"), 0);
  std::string forged = routerSignature(body, "r1", "not-the-cluster-token");
  EXPECT_EQ(post(body, {{"x-request-id", "r1"}, {"x-kvf-transfer-auth", forged}}).status, 403);
  // Signed for another request id.
  std::string other = routerSignature(body, "r2");
  EXPECT_EQ(post(body, {{"x-request-id", "r3"}, {"x-kvf-transfer-auth", other}}).status, 403);
  // Signed by the router for other params: a client cannot swap in its own source.
  std::string signed_lease = routerSignature(lease_body, "r4");
  EXPECT_EQ(post(body, {{"x-request-id", "r4"}, {"x-kvf-transfer-auth", signed_lease}}).status,
            403);
  EXPECT_GE(metric(d, "kvfabric_engine_kv_transfer_params_refused_total"), 5);
  EXPECT_EQ(evil.received(), "");
  // The router's own request is served once; the same header again is a replay.
  http::Headers router = {{"x-request-id", "r5"},
                          {"x-kvf-transfer-auth", routerSignature(lease_body, "r5")}};
  EXPECT_EQ(post(lease_body, router).status, 200);
  EXPECT_EQ(post(lease_body, router).status, 403);
  // Without any kv_transfer_params the public API is as open as before.
  EXPECT_EQ(post(R"({"prompt": )" + tokens(100, 11) + R"(, "max_tokens": 2})", {}).status, 200);
}

// Remote-decode leases are bounded in duration, number and blocks on the engine itself.
TEST_F(KvPushTest, LeasesAreBoundedServerSide) {
  Engine& p = start("P", ", max_leases: 2, max_lease_ms: 5000");
  auto lease = [&](int n, int salt, int lease_ms) {
    std::string body = R"({"prompt": )" + tokens(n, salt) +
                       R"(, "max_tokens": 2, "kv_transfer_params": {"do_remote_decode": true, )" +
                       R"("lease_ms": )" + std::to_string(lease_ms) + "}}";
    return call(p.port, "POST", "/v1/completions", body).status;
  };
  EXPECT_EQ(lease(200, 20, 600000), 400);  // longer than max_lease_ms
  // 4000 blocks, at most a quarter leased: 1001 blocks in one prompt is too many.
  EXPECT_EQ(lease(16016, 21, 5000), 429);
  EXPECT_EQ(lease(200, 22, 5000), 200);
  EXPECT_EQ(lease(200, 23, 5000), 200);
  EXPECT_EQ(lease(200, 24, 5000), 429);  // max_leases
  EXPECT_GE(metric(p, "kvfabric_engine_leases_refused_total"), 2);
  EXPECT_EQ(metric(p, "kvfabric_engine_kv_push_leases"), 2);
  // Expired leases give the capacity back.
  EXPECT_TRUE(waitMetric(p, "kvfabric_engine_kv_push_leases", 0, kAmpleWait));
  EXPECT_EQ(lease(200, 25, 5000), 200);
}

// The worker API checks the token on the request head: an unauthenticated peer that announces
// a large body gets its 401 at once, without the server waiting for (or buffering) the body.
TEST_F(KvPushTest, WorkerApiRefusesBeforeReadingTheBody) {
  Engine& c = start("C");
  std::string answer = answerToHeadAlone(
      static_cast<uint16_t>(c.worker_port),
      "POST /kv/push HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: 4000000\r\n\r\n");
  ASSERT_FALSE(answer.empty()) << "no answer before the body arrived";
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 401")) << answer;
}

// The worker API never runs open by accident: without a token the engine refuses to start.
TEST_F(KvPushTest, EngineWithoutWorkerTokenRefusesToStart) {
  fs::path config = dir_ / "open.yaml";
  std::ofstream(config) << "instance_id: open\nport: 0\n"
                        << "profile: " << source_
                        << "/engine/profiles/qwen3-coder-30b-a3b-h20.yaml\n"
                        << "kv_events: {enabled: false}\nworker: {port: 0}\n";
  unsetenv("KVF_WORKER_TOKEN");
  auto proc = startLogged({bin_ + "/kvf-engine", "--config", config.string(), "--worker_port",
                           std::to_string(pickFreePort().value_or(0))},
                          (dir_ / "open.log").string());
  auto exit = proc->wait(std::chrono::seconds(20));
  ASSERT_TRUE(exit.has_value()) << readLog(*proc);
  EXPECT_NE(readLog(*proc).find("worker.token"), std::string::npos) << readLog(*proc);
  // Explicitly insecure, it starts.
  fs::path open = dir_ / "insecure.yaml";
  std::string text = readFile(config.string());
  text.replace(text.find("worker: {port: 0}"), 17, "worker: {insecure: true}");
  std::ofstream(open) << text;
  auto insecure = startLogged({bin_ + "/kvf-engine", "--config", open.string(), "--worker_port",
                               std::to_string(pickFreePort().value_or(0))},
                              (dir_ / "insecure.log").string());
  EXPECT_TRUE(waitForLog(*insecure, "kvf-engine ready", std::chrono::seconds(20)))
      << readLog(*insecure);
  insecure->kill();
}

TEST_F(KvPushTest, EvictedOnTheHolderFallsBackAtOnce) {
  Engine& c = start("C");
  Engine& d = start("D");
  std::string prompt = tokens(3000, 4);
  complete(c, prompt, "");
  ASSERT_EQ(call(c.port, "POST", "/reset_prefix_cache").status, 200);  // every block evicted
  double seconds = 0;
  // The holder's answer, not the deadline, ends the fetch: the reason says so, and the request
  // is answered long before the deadline.
  bj::object r = complete(d, prompt, source(c), &seconds);
  EXPECT_EQ(std::string(result(r)["status"].as_string()), "fallback") << r;
  EXPECT_EQ(std::string(result(r)["reason"].as_string()), "source holds none of the blocks");
  EXPECT_EQ(cached(r), 0);
  EXPECT_LT(seconds, kAmpleDeadlineMs / 2000.0) << "fallback took " << seconds << " s";
  EXPECT_TRUE(waitMetric(d, "kvfabric_engine_kv_push_quarantined_blocks", 0, kAmpleWait));
}

TEST_F(KvPushTest, CorruptedBlocksAreRejected) {
  Engine& c = start("C", ", fault: corrupt");
  Engine& c2 = start("C2", ", fault: corrupt_content");
  Engine& d = start("D");
  std::string prompt = tokens(3000, 5), prompt2 = tokens(3000, 15);
  complete(c, prompt, "");
  complete(c2, prompt2, "");
  double seconds = 0;
  // The damage, not the deadline, ends each fetch: the reason names it, and the request is
  // answered long before the deadline (with a deadline a loaded machine cannot miss, the
  // completion notice that carries the checksums always arrives).
  bj::object r = complete(d, prompt, source(c), &seconds);
  EXPECT_EQ(std::string(result(r)["status"].as_string()), "fallback") << r;
  EXPECT_NE(std::string(result(r)["reason"].as_string()).find("checksum mismatch"),
            std::string::npos)
      << r;
  EXPECT_LT(seconds, kAmpleDeadlineMs / 2000.0);
  bj::object r2 = complete(d, prompt2, source(c2), &seconds);
  EXPECT_EQ(std::string(result(r2)["status"].as_string()), "fallback") << r2;
  EXPECT_NE(std::string(result(r2)["reason"].as_string()).find("does not match its hash"),
            std::string::npos)
      << r2;
  EXPECT_LT(seconds, kAmpleDeadlineMs / 2000.0);
  // Nothing damaged entered D's cache: D now serves the prompt to E, which verifies it.
  Engine& e = start("E");
  bj::object r3 = complete(e, prompt, source(d));
  EXPECT_EQ(std::string(result(r3)["status"].as_string()), "ok") << r3;
}

TEST_F(KvPushTest, StalledHolderFallsBackAndItsLatePushCorruptsNothing) {
  // C stalls 6 s after D granted its claim: far past D's 300 ms deadline even when a loaded
  // machine delays D's timer by seconds, so the deadline, not C's late write, decides.
  Engine& c = start("C", ", fault: stall, fault_stall_ms: 6000");
  Engine& d = start("D");
  std::string prompt = tokens(3000, 6);
  complete(c, prompt, "");
  double seconds = 0;
  bj::object r = complete(d, prompt, source(c, 300), &seconds);
  EXPECT_EQ(std::string(result(r)["status"].as_string()), "fallback") << r;
  EXPECT_NE(std::string(result(r)["reason"].as_string()).find("in time"), std::string::npos) << r;
  EXPECT_GE(seconds, 0.3);
  EXPECT_LT(seconds, 0.3 + kDeadlineSlackSeconds) << "fallback took " << seconds << " s";
  // The landing blocks stay out of use until C's late push has landed, then come back.
  EXPECT_GT(metric(d, "kvfabric_engine_kv_push_quarantined_blocks"), 0);
  EXPECT_TRUE(waitMetric(d, "kvfabric_engine_kv_push_quarantined_blocks", 0, kAmpleWait));
  // D's cache is intact: a third engine pulls the prompt from D and verifies every block.
  Engine& e = start("E");
  bj::object r2 = complete(e, prompt, source(d));
  EXPECT_EQ(std::string(result(r2)["status"].as_string()), "ok") << r2;
  EXPECT_EQ(cached(r2), 2992);
}

TEST_F(KvPushTest, HolderKilledDuringThePushFallsBack) {
  Engine& c = start("C", ", fault: stall, fault_stall_ms: 5000");
  Engine& d = start("D");
  std::string prompt = tokens(3000, 7);
  complete(c, prompt, "");
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    c.proc->kill();  // SIGKILL while C holds the push request
  });
  double seconds = 0;
  bj::object r = complete(d, prompt, source(c, 800), &seconds);
  killer.join();
  EXPECT_EQ(std::string(result(r)["status"].as_string()), "fallback") << r;
  EXPECT_LT(seconds, 0.8 + kDeadlineSlackSeconds) << "fallback took " << seconds << " s";
  // C is gone, so nothing can land any more: the blocks come back without waiting for C.
  EXPECT_TRUE(waitMetric(d, "kvfabric_engine_kv_push_quarantined_blocks", 0, kAmpleWait));
  // The next request to the dead source fails on the refused connection, not at its deadline.
  bj::object r2 = complete(d, tokens(3000, 8), source(c), &seconds);
  EXPECT_EQ(std::string(result(r2)["status"].as_string()), "fallback") << r2;
  EXPECT_LT(seconds, kAmpleDeadlineMs / 2000.0) << r2;
}

}  // namespace
}  // namespace kvf::testing
