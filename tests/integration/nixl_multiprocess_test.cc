// vLLM's NixlConnector dialect end to end on loopback, driving real kvf-engine processes
// (worker.kv_connector: nixl) with the exact bodies vLLM's toy_proxy_server sends
// (tests/fixtures/vllm/nixl/): the first leg to P answers with vLLM's remote_* fields and holds
// the blocks under a lease; the second leg to D reads them over kvfabric's one-sided get, and D's
// engine checks every landed byte against the block's content. Migration is the same two legs
// with the cache holder C first. Failures: P's answer missing a field, P killed before D reads,
// the lease expiring before D reads - each ends in D prefilling locally within a bounded time.
// The test plays the router: it signs each leg's kv_transfer_params with the cluster's token
// (docs/security.md); an unsigned or tampered leg is refused, and the side channel answers a
// caller without the token with 401 before reading its body.
#include <gtest/gtest.h>

#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "common/http_client.h"
#include "common/json.h"
#include "common/process.h"
#include "common/sse.h"
#include "common/strings.h"
#include "protocol/transfer_auth.h"
#include "tests/testing/child_process.h"
#include "tests/testing/io_thread.h"
#include "tests/testing/poll.h"
#include "tests/testing/socket_read.h"

namespace kvf::testing {
namespace {

namespace fs = std::filesystem;
namespace bj = boost::json;
using namespace std::chrono_literals;

constexpr int kBlockSize = 16;
constexpr int kPayloadBytesPerBlock = 256;
constexpr const char* kToken = "nixl-test-token";

struct Engine {
  std::unique_ptr<Process> process;
  std::shared_ptr<http::HttpClient> client;
  uint16_t worker_port = 0;
};

// The x-kvf-transfer-auth header the router sends with `params` under `request_id`.
std::string routerSignature(const bj::value& params, const std::string& request_id,
                            const std::string& token = kToken) {
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  return protocol::signKvTransfer(protocol::transferAuthKey(token), params, request_id, now_ms,
                                  protocol::randomNonce());
}

class NixlMultiprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = envOr("KVF_SOURCE_DIR", fs::current_path().string());
    bin_ = envOr("KVF_BIN_DIR", source_ + "/build/bin");
    dir_ = fs::temp_directory_path() / ("kvf_nixl_mp_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    setenv("KVF_WORKER_TOKEN", kToken, 1);
  }

  void TearDown() override {
    engines_.clear();
    fs::remove_all(dir_);
  }

  // An engine in the NIXL dialect whose leases last `lease_ms` (vLLM's kv_lease_duration).
  Engine& startEngine(const std::string& id, int64_t lease_ms = 30000) {
    fs::path config = dir_ / (id + ".yaml");
    std::ofstream(config)
        << "port: 0\nprofile: " << source_ << "/engine/profiles/qwen3-coder-30b-a3b-h20.yaml\n"
        << "served_model_name: llama-3.1-8b\ntime_scale: 20\nmax_model_len: 32768\n"
        << "cache: {block_size: " << kBlockSize
        << ", payload_bytes_per_block: " << kPayloadBytesPerBlock << ", num_gpu_blocks: 4096}\n"
        << "kv_events: {endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*'}\n"
        << "worker: {kv_connector: nixl, engine_id: engine-" << id
        << ", default_lease_ms: " << lease_ms << "}\n";
    auto worker = pickFreePort();
    EXPECT_TRUE(worker.ok()) << worker.status();
    Engine e;
    e.worker_port = static_cast<uint16_t>(worker.ok() ? *worker : 0);
    e.process = startLogged({bin_ + "/kvf-engine", "--config", config.string(), "--instance_id", id,
                             "--worker_port", std::to_string(worker.ok() ? *worker : 0)},
                            (dir_ / (id + ".log")).string());
    EXPECT_TRUE(waitForLog(*e.process, "kvf-engine ready", 30s)) << readLog(*e.process);
    auto port = static_cast<uint16_t>(std::stoi(logValue(*e.process, "kvf-engine ready", "port")));
    e.client = http::HttpClient::create(io_.executor(), "127.0.0.1", port);
    engines_.push_back(std::move(e));
    return engines_.back();
  }

  // POSTs `body`; its kv_transfer_params, if any, signed as the router signs them unless
  // `signature` is given (then that header value, "" for none).
  absl::StatusOr<http::Response> post(Engine& e, const std::string& path, const bj::value& body,
                                      const std::string& request_id,
                                      std::optional<std::string> signature = std::nullopt) {
    http::ClientRequest r;
    r.method = "POST";
    r.target = path;
    r.body = bj::serialize(body);
    r.headers = {{"X-Request-Id", request_id}, {"Content-Type", "application/json"}};
    const bj::value* params =
        body.is_object() ? body.as_object().if_contains("kv_transfer_params") : nullptr;
    if (!signature && params != nullptr) signature = routerSignature(*params, request_id);
    if (signature && !signature->empty()) {
      r.headers.emplace_back(std::string(protocol::kTransferAuthHeader), *signature);
    }
    r.read_timeout = 20s;
    return io_.run([&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
      co_return co_await e.client->request(r);
    });
  }

  // The first sample of `name` whose labels contain `label` (e.g. route="meta"); -1 if none.
  double metric(Engine& e, const std::string& name, const std::string& label = "") {
    http::ClientRequest r;
    r.method = "GET";
    r.target = "/metrics";
    auto resp = io_.run([&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
      co_return co_await e.client->request(r);
    });
    if (!resp.ok()) return -1;
    for (size_t at = resp->body.find("\n" + name); at != std::string::npos;
         at = resp->body.find("\n" + name, at + 1)) {
      size_t end = resp->body.find('\n', at + 1);
      std::string line = resp->body.substr(at + 1, end - at - 1);
      const char next = line.size() > name.size() ? line[name.size()] : '\0';
      if (next != ' ' && next != '{') continue;  // a longer name
      if (line.find(label) == std::string::npos) continue;
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
    return -1;
  }

  template <class P>
  bool eventually(P pred, std::chrono::milliseconds timeout = 20s) {
    return kvf::testing::eventually(pred, timeout);
  }

  bj::object fixture(const std::string& name) {
    auto text = readFile(source_ + "/tests/fixtures/vllm/nixl/" + name);
    auto obj = json::parseObject(text);
    EXPECT_TRUE(obj.ok()) << name << ": " << obj.status();
    return obj.ok() ? *obj : bj::object();
  }

  // The client's body with `prompt_tokens` token ids, as the replayer sends it.
  static bj::object clientBody(int prompt_tokens, bool stream) {
    std::vector<int> t(static_cast<size_t>(prompt_tokens));
    std::iota(t.begin(), t.end(), 1000);
    bj::object o;
    o["model"] = "llama-3.1-8b";
    o["prompt"] = bj::value_from(t);
    o["max_tokens"] = 4;
    o["min_tokens"] = 4;
    o["stream"] = stream;
    return o;
  }

  // toy_proxy_server's first leg from a client body.
  static bj::object prefillLeg(bj::object body) {
    body["kv_transfer_params"] =
        bj::parse(R"({"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,)"
                  R"("remote_block_ids":null,"remote_host":null,"remote_port":null})");
    body["stream"] = false;
    body["max_tokens"] = 1;
    body.erase("stream_options");
    body.erase("min_tokens");
    body.erase("min_completion_tokens");
    return body;
  }

  // The decode leg's final JSON (the last SSE chunk that has one, or the plain body).
  static bj::object finalObject(const http::Response& r) {
    if (r.body.starts_with("data:") || r.body.find("\ndata:") != std::string::npos) {
      bj::object last;
      sse::Parser parser;
      (void)parser.feed(r.body, [&](sse::Event&& ev) {
        if (ev.data == "[DONE]") return;
        auto o = json::parseObject(ev.data);
        if (o.ok() && o->contains("kv_transfer_result")) last = *o;
      });
      return last;
    }
    auto o = json::parseObject(r.body);
    return o.ok() ? *o : bj::object();
  }

  std::string source_, bin_;
  fs::path dir_;
  IoThread io_;
  std::deque<Engine> engines_;
};

TEST_F(NixlMultiprocessTest, OffloadWithTheFixtureLegsReadsPsBlocksOnD) {
  Engine& p = startEngine("p");
  Engine& d = startEngine("d");
  bj::object leg1 = fixture("p_leg_completion.json");
  bj::object client = fixture("client_completion.json");
  const std::string rid(leg1.at("headers").as_object().at("X-Request-Id").as_string());
  auto first = post(p, std::string(leg1.at("path").as_string()), leg1.at("body"), rid);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->status, 200) << first->body;
  auto answer = json::parseObject(first->body);
  ASSERT_TRUE(answer.ok());
  const bj::object& params = answer->at("kv_transfer_params").as_object();
  // Every field vLLM's P returns (v0.21+ shape, blocks per KV cache group).
  EXPECT_EQ(params.at("do_remote_prefill"), true);
  EXPECT_EQ(params.at("do_remote_decode"), false);
  EXPECT_EQ(params.at("remote_engine_id"), "engine-p");
  EXPECT_EQ(params.at("remote_host"), "127.0.0.1");
  EXPECT_GT(params.at("remote_port").as_int64(), 0);
  EXPECT_FALSE(params.at("remote_request_id").as_string().empty());
  EXPECT_EQ(params.at("tp_size"), 1);
  EXPECT_EQ(params.at("remote_num_tokens"), 100);
  ASSERT_EQ(params.at("remote_block_ids").as_array().size(), 1u);
  EXPECT_EQ(params.at("remote_block_ids").as_array()[0].as_array().size(), 100u / kBlockSize);
  EXPECT_EQ(metric(p, "kvfabric_engine_kv_push_leases"), 1);

  // toy_proxy_server: P's params set on the client's own body, unchanged.
  bj::object leg2 = client.at("body").as_object();
  leg2["kv_transfer_params"] = params;
  auto second = post(d, std::string(client.at("path").as_string()), leg2, rid);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->status, 200) << second->body;
  bj::object last = finalObject(*second);
  ASSERT_TRUE(last.contains("kv_transfer_result")) << second->body;
  const bj::object& result = last.at("kv_transfer_result").as_object();
  EXPECT_EQ(result.at("status"), "ok") << second->body;
  // D's engine accepted the 6 blocks only because each landed byte matched the block's content.
  EXPECT_EQ(result.at("pushed_bytes").as_int64(), 6 * kPayloadBytesPerBlock);
  EXPECT_EQ(result.at("pushed_tokens").as_int64(), 6 * kBlockSize);
  EXPECT_FALSE(last.contains("kv_transfer_params")) << "P's params are D's input, not its answer";
  // D's read-completion notification ended P's hold at once.
  EXPECT_TRUE(eventually([&] { return metric(p, "kvfabric_engine_kv_push_leases") == 0; }, 5s));
  EXPECT_EQ(metric(p, "kvfabric_worker_nixl_notify_total"), 1);
}

TEST_F(NixlMultiprocessTest, MigrationReadsTheCacheHoldersPrefix) {
  Engine& c = startEngine("c");
  Engine& d = startEngine("d");
  auto turn1 = post(c, "/v1/completions", clientBody(4096, false), "turn-1");
  ASSERT_TRUE(turn1.ok() && turn1->status == 200) << (turn1.ok() ? turn1->body : "");
  // Turn 2 re-sends the prefix and more: C's first leg is a cache hit.
  bj::object client = clientBody(4608, true);
  auto first = post(c, "/v1/completions", prefillLeg(client), "turn-2");
  ASSERT_TRUE(first.ok() && first->status == 200) << (first.ok() ? first->body : "");
  auto answer = json::parseObject(first->body);
  ASSERT_TRUE(answer.ok());
  const auto& usage = answer->at("usage").as_object();
  EXPECT_EQ(usage.at("prompt_tokens_details").as_object().at("cached_tokens").as_int64(), 4096);
  client["kv_transfer_params"] = answer->at("kv_transfer_params");
  auto second = post(d, "/v1/completions", client, "turn-2");
  ASSERT_TRUE(second.ok() && second->status == 200) << (second.ok() ? second->body : "");
  bj::object last = finalObject(*second);
  ASSERT_TRUE(last.contains("kv_transfer_result")) << second->body;
  const bj::object& result = last.at("kv_transfer_result").as_object();
  EXPECT_EQ(result.at("status"), "ok") << second->body;
  // All but the last block of the 288: the prompt's last token is always computed.
  EXPECT_EQ(result.at("pushed_bytes").as_int64(), 287 * kPayloadBytesPerBlock);
  EXPECT_TRUE(eventually([&] { return metric(c, "kvfabric_engine_kv_push_leases") == 0; }, 5s));
}

TEST_F(NixlMultiprocessTest, AnswerMissingAFieldMakesDPrefillLocally) {
  Engine& p = startEngine("p", 1500);
  Engine& d = startEngine("d");
  bj::object client = clientBody(512, false);
  auto first = post(p, "/v1/completions", prefillLeg(client), "missing");
  ASSERT_TRUE(first.ok() && first->status == 200);
  auto answer = json::parseObject(first->body);
  ASSERT_TRUE(answer.ok());
  bj::object params = answer->at("kv_transfer_params").as_object();
  params.erase("remote_request_id");
  client["kv_transfer_params"] = params;
  auto second = post(d, "/v1/completions", client, "missing");
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->status, 200) << second->body;
  bj::object last = finalObject(*second);
  ASSERT_TRUE(last.contains("kv_transfer_result")) << second->body;
  const bj::object& result = last.at("kv_transfer_result").as_object();
  EXPECT_EQ(result.at("status"), "fallback");
  EXPECT_NE(std::string(result.at("reason").as_string()).find("remote_request_id"),
            std::string::npos)
      << second->body;
  EXPECT_EQ(last.at("choices").as_array()[0].as_object().at("text").as_string().size() > 0, true);
  // Nobody reads P's blocks: the lease ends them (vLLM's lease, no heartbeat).
  EXPECT_TRUE(eventually([&] { return metric(p, "kvfabric_engine_kv_push_leases") == 0; }, 10s));
  EXPECT_EQ(metric(p, "kvfabric_worker_leases_expired_total"), 1);
}

TEST_F(NixlMultiprocessTest, LeaseExpiredBeforeDReadsFallsBackToLocalPrefill) {
  Engine& p = startEngine("p", 1000);
  Engine& d = startEngine("d");
  bj::object client = clientBody(512, false);
  auto first = post(p, "/v1/completions", prefillLeg(client), "late");
  ASSERT_TRUE(first.ok() && first->status == 200);
  auto answer = json::parseObject(first->body);
  ASSERT_TRUE(answer.ok());
  ASSERT_TRUE(eventually([&] { return metric(p, "kvfabric_engine_kv_push_leases") == 0; }, 10s));
  client["kv_transfer_params"] = answer->at("kv_transfer_params");
  auto second = post(d, "/v1/completions", client, "late");
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->status, 200) << second->body;
  bj::object last = finalObject(*second);
  ASSERT_TRUE(last.contains("kv_transfer_result")) << second->body;
  const bj::object& result = last.at("kv_transfer_result").as_object();
  EXPECT_EQ(result.at("status"), "fallback") << second->body;
  EXPECT_NE(std::string(result.at("reason").as_string()).find("no lease"), std::string::npos)
      << second->body;
}

TEST_F(NixlMultiprocessTest, PKilledBeforeDReadsFallsBackWithinTheDeadline) {
  Engine& p = startEngine("p");
  Engine& d = startEngine("d");
  bj::object client = clientBody(2048, false);
  auto first = post(p, "/v1/completions", prefillLeg(client), "killed");
  ASSERT_TRUE(first.ok() && first->status == 200);
  auto answer = json::parseObject(first->body);
  ASSERT_TRUE(answer.ok());
  p.process->kill();
  ASSERT_TRUE(p.process->wait(5s).has_value());
  client["kv_transfer_params"] = answer->at("kv_transfer_params");
  auto start = std::chrono::steady_clock::now();
  auto second = post(d, "/v1/completions", client, "killed");
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->status, 200) << second->body;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  bj::object last = finalObject(*second);
  ASSERT_TRUE(last.contains("kv_transfer_result")) << second->body;
  const bj::object& result = last.at("kv_transfer_result").as_object();
  EXPECT_EQ(result.at("status"), "fallback") << second->body;
  EXPECT_EQ(metric(d, "kvfabric_engine_kv_push_quarantined_blocks"), 0);
}

// Only the router may name the holder D reads from (and sends its worker token to): a decode
// leg without the router's signature, or with a field changed after signing, is refused before
// D contacts anyone, and so is an unsigned first leg (no lease is taken).
TEST_F(NixlMultiprocessTest, UnsignedOrTamperedLegsAreRefused) {
  Engine& p = startEngine("p");
  Engine& d = startEngine("d");
  bj::object client = clientBody(512, false);
  auto unsigned_first = post(p, "/v1/completions", prefillLeg(client), "unsigned-1", "");
  ASSERT_TRUE(unsigned_first.ok());
  EXPECT_EQ(unsigned_first->status, 403) << unsigned_first->body;
  EXPECT_EQ(metric(p, "kvfabric_engine_kv_push_leases"), 0);

  auto first = post(p, "/v1/completions", prefillLeg(client), "legs");
  ASSERT_TRUE(first.ok() && first->status == 200) << (first.ok() ? first->body : "");
  auto answer = json::parseObject(first->body);
  ASSERT_TRUE(answer.ok());
  const bj::value params = answer->at("kv_transfer_params");
  client["kv_transfer_params"] = params;

  auto unsigned_second = post(d, "/v1/completions", client, "legs", "");
  ASSERT_TRUE(unsigned_second.ok());
  EXPECT_EQ(unsigned_second->status, 403) << unsigned_second->body;

  // Signed, then pointed at another side channel (a listener that would collect D's token).
  const std::string signature = routerSignature(params, "legs");
  bj::object tampered = params.as_object();
  tampered["remote_port"] = tampered.at("remote_port").as_int64() + 1;
  client["kv_transfer_params"] = tampered;
  auto tampered_second = post(d, "/v1/completions", client, "legs", signature);
  ASSERT_TRUE(tampered_second.ok());
  EXPECT_EQ(tampered_second->status, 403) << tampered_second->body;

  // Signed for another request id: refused too.
  client["kv_transfer_params"] = params;
  auto other_id = post(d, "/v1/completions", client, "legs", routerSignature(params, "other"));
  ASSERT_TRUE(other_id.ok());
  EXPECT_EQ(other_id->status, 403) << other_id->body;
  EXPECT_EQ(metric(d, "kvfabric_engine_kv_transfer_params_refused_total"), 3);
  EXPECT_EQ(metric(p, "kvfabric_worker_nixl_meta_total"), 0) << "D contacted P";

  // The router's own signature of the same leg is accepted and reads P's blocks.
  auto second = post(d, "/v1/completions", client, "legs");
  ASSERT_TRUE(second.ok() && second->status == 200) << (second.ok() ? second->body : "");
  bj::object last = finalObject(*second);
  ASSERT_TRUE(last.contains("kv_transfer_result")) << second->body;
  EXPECT_EQ(last.at("kv_transfer_result").as_object().at("status"), "ok") << second->body;
}

// The side channel (/kv/nixl/meta, /kv/nixl/notify) checks the worker token on the request
// head: a caller without it that announces a large body gets 401 at once, no body byte read.
TEST_F(NixlMultiprocessTest, SideChannelWithoutTheTokenIsRefusedBeforeItsBody) {
  Engine& p = startEngine("p");
  for (const char* target : {"/kv/nixl/meta", "/kv/nixl/notify"}) {
    std::string answer = answerToHeadAlone(
        p.worker_port, strCat("POST ", target,
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Content-Length: 4000000\r\n\r\n"));
    ASSERT_FALSE(answer.empty()) << target << ": no answer before the body arrived";
    EXPECT_TRUE(answer.starts_with("HTTP/1.1 401")) << target << ": " << answer;
  }
}

// A notification for a lease the holder does not hold (never taken, or already ended) is
// refused and counted; it releases nothing.
TEST_F(NixlMultiprocessTest, NotifyForAnUnknownLeaseIsRefusedAndCounted) {
  Engine& p = startEngine("p");
  auto side = http::HttpClient::create(io_.executor(), "127.0.0.1", p.worker_port);
  auto call = [&](const std::string& target, const std::string& body, bool with_token) {
    http::ClientRequest r;
    r.method = "POST";
    r.target = target;
    r.body = body;
    r.headers = {{"Content-Type", "application/json"}};
    if (with_token) r.headers.emplace_back("Authorization", strCat("Bearer ", kToken));
    r.read_timeout = 5s;
    return io_.run([&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
      co_return co_await side->request(r);
    });
  };
  auto unknown = call("/kv/nixl/notify", R"({"remote_request_id":"no-such-lease"})", true);
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_EQ(unknown->status, 404) << unknown->body;
  auto meta =
      call("/kv/nixl/meta", R"({"remote_request_id":"no-such-lease","block_ids":[0]})", true);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->status, 404) << meta->body;
  EXPECT_EQ(metric(p, "kvfabric_worker_nixl_refused_total", "route=\"notify\""), 1);
  EXPECT_EQ(metric(p, "kvfabric_worker_nixl_refused_total", "route=\"meta\""), 1);

  // A real lease, notified twice: the first ends it, the second is refused.
  bj::object client = clientBody(512, false);
  auto first = post(p, "/v1/completions", prefillLeg(client), "twice");
  ASSERT_TRUE(first.ok() && first->status == 200) << (first.ok() ? first->body : "");
  auto answer = json::parseObject(first->body);
  ASSERT_TRUE(answer.ok());
  const std::string lease(
      answer->at("kv_transfer_params").as_object().at("remote_request_id").as_string());
  const std::string notify = strCat(R"({"remote_request_id":")", lease, R"("})");
  auto without_token = call("/kv/nixl/notify", notify, false);
  ASSERT_TRUE(without_token.ok());
  EXPECT_EQ(without_token->status, 401);
  EXPECT_EQ(metric(p, "kvfabric_engine_kv_push_leases"), 1);
  auto once = call("/kv/nixl/notify", notify, true);
  ASSERT_TRUE(once.ok());
  EXPECT_EQ(once->status, 200) << once->body;
  EXPECT_TRUE(eventually([&] { return metric(p, "kvfabric_engine_kv_push_leases") == 0; }, 5s));
  auto twice = call("/kv/nixl/notify", notify, true);
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ(twice->status, 404) << twice->body;
  EXPECT_EQ(metric(p, "kvfabric_worker_nixl_notify_total"), 1);
  EXPECT_EQ(metric(p, "kvfabric_worker_nixl_refused_total", "route=\"notify\""), 2);
}

}  // namespace
}  // namespace kvf::testing
