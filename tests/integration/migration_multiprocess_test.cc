// KV movement end to end: three kvf-engine processes with worker control servers behind a
// kvf-router process. Push-migrate: a session's turn 1 lands on C; C is drained, so the unified
// policy sends turn 2 to D with C as the push source: D reports cached_tokens covering C's
// prefix, the pushed bytes are exactly C's blocks, and turn 3 hits the migrated blocks on D
// locally. Offload: the elastic policy prefills a HEAVY request on P and decodes it on D, the
// client seeing one response (plain and streaming); with P killed, D prefills locally.
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <numeric>

#include <boost/asio/post.hpp>

#include "common/http_client.h"
#include "common/json.h"
#include "common/process.h"
#include "common/sse.h"
#include "common/strings.h"
#include "tests/testing/child_process.h"
#include "tests/testing/engine_cluster.h"
#include "tests/testing/http_call.h"
#include "tests/testing/io_thread.h"
#include "tests/testing/poll.h"
#include "tests/testing/temp_dir.h"

namespace kvf::testing {
namespace {

namespace fs = std::filesystem;
namespace bj = boost::json;
using namespace std::chrono_literals;

constexpr int kBlockSize = 16;
constexpr int kPayloadBytesPerBlock = 256;

std::string prompt(int n, bool stream = false, int base = 1000) {
  std::vector<int> t(n);
  std::iota(t.begin(), t.end(), base);
  // As the replayer sends them: min_tokens = max_tokens (P's one-token prefill must drop it).
  return strCat("{\"model\":\"test-model\",\"max_tokens\":4,\"min_tokens\":4,\"stream\":",
                stream ? "true,\"stream_options\":{\"include_usage\":true}" : "false",
                ",\"prompt\":[", strJoin(t, ","), "]}");
}

int64_t cachedTokens(const bj::object& body) {
  const auto& usage = body.at("usage").as_object();
  return usage.at("prompt_tokens_details").as_object().at("cached_tokens").as_int64();
}

class MigrationMultiprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = envOr("KVF_SOURCE_DIR", fs::current_path().string());
    bin_ = envOr("KVF_BIN_DIR", source_ + "/build/bin");
    dir_ = freshTempDir("kvf_migrate_mp");
    setenv("KVF_WORKER_TOKEN", "mp-test-token", 1);
  }

  // Starts 3 engines with worker servers and a router with `policy_yaml`.
  // `connector`: every instance's kv_connector (engines and router), "kvfabric" or "nixl".
  void startCluster(const std::string& policy_yaml, double health_interval_s = 0.2,
                    const std::string& connector = "kvfabric", double time_scale = 20) {
    EngineClusterOptions o;
    o.engines = 3;
    o.engine_yaml = strCat(
        "time_scale: ", time_scale, "\nmax_model_len: 32768\ncache: {block_size: ", kBlockSize,
        ", payload_bytes_per_block: ", kPayloadBytesPerBlock, ", num_gpu_blocks: 4096}\n");
    o.kv_connector = connector;
    o.policy_yaml = policy_yaml;
    o.router_yaml = strCat("health: {interval_s: ", health_interval_s,
                           "}\ndecision_log: ", (dir_ / "decisions.jsonl").string(), "\n");
    cluster_ = std::make_unique<EngineCluster>(dir_, source_, bin_);
    cluster_->start(std::move(o));
    client_ = http::HttpClient::create(io_.executor(), "127.0.0.1", cluster_->routerPort());
  }

  absl::StatusOr<http::Response> call(std::string method, std::string target, std::string body,
                                      http::Headers headers = {}) {
    return httpCall(io_, *client_, std::move(method), std::move(target), std::move(body),
                    std::move(headers));
  }

  int64_t indexBlocks(const std::string& id) {
    auto r = call("GET", "/admin/instances", "", {{"Authorization", "Bearer adm"}});
    if (!r.ok()) return -1;
    auto obj = json::parseObject(r->body);
    if (!obj.ok()) return -1;
    for (const auto& v : obj->at("instances").as_array()) {
      if (v.as_object().at("id").as_string() == id) {
        return v.as_object().at("index_blocks").as_int64();
      }
    }
    return -1;
  }

  template <class P>
  bool eventually(P pred, std::chrono::milliseconds timeout = 20s) {
    return kvf::testing::eventually(pred, timeout);
  }

  // The value of the first sample of `name` (an unlabelled counter or gauge) on engine `i`, or
  // on the router when `i` is -1; -1 when it cannot be read.
  double metric(int i, const std::string& name, const std::string& label = "") {
    std::shared_ptr<http::HttpClient> client = client_;
    if (i >= 0) {
      client = http::HttpClient::create(io_.executor(), "127.0.0.1", cluster_->ports(i).http);
    }
    auto r = httpCall(io_, *client, "GET", "/metrics");
    if (!r.ok()) return -1;
    for (size_t at = r->body.find("\n" + name); at != std::string::npos;
         at = r->body.find("\n" + name, at + 1)) {
      std::string line = r->body.substr(at + 1, r->body.find('\n', at + 1) - at - 1);
      const char next = line.size() > name.size() ? line[name.size()] : '\0';
      if ((next != ' ' && next != '{') || line.find(label) == std::string::npos) continue;
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
    return -1;
  }

  // A heavy request offloaded to P (e1) whose client disconnects while P prefills (a slow leg:
  // engines at a tenth of real time): the router closes the leg, P's engine aborts it at once
  // instead of finishing the prefill and leasing its blocks for nobody, and D (e0) is never
  // asked.
  void clientLeavesDuringThePrefillLeg(const std::string& connector) {
    startCluster(
        "{kind: elastic, classify: {warm_max_new_tokens: 100, medium_max_new_tokens: 1000}}", 60,
        connector, 0.1);
    auto canceller = std::make_shared<http::RequestCanceller>();
    http::ClientRequest req;
    req.method = "POST";
    req.target = "/v1/completions";
    req.body = prompt(12000);
    req.canceller = canceller;
    auto answer = asio::co_spawn(
        io_.context(),
        [&]() -> asio::awaitable<absl::StatusOr<http::Response>> {
          co_return co_await client_->request(req);
        },
        asio::use_future);
    // 12000 tokens are two chunked-prefill steps on P (8192 tokens, then the rest), each of
    // several seconds of wall time at this scale: the engine shows the request running after
    // the first, and the leg is far from done. (750 blocks: within P's lease bound.)
    ASSERT_TRUE(eventually([&] { return metric(1, "vllm:num_requests_running") == 1; }))
        << readLog(cluster_->router());
    asio::post(io_.context(), [canceller] { canceller->cancel(); });
    ASSERT_EQ(answer.wait_for(10s), std::future_status::ready);
    EXPECT_FALSE(answer.get().ok());
    EXPECT_TRUE(
        eventually([&] { return metric(1, "kvfabric_engine_requests_aborted_total") == 1; }, 3s))
        << "P's prefill ran on after its client left";
    // The HTTP side counts the abort at once; the engine loop takes it off the batch and
    // releases its lease between steps, and a step here lasts seconds.
    EXPECT_TRUE(eventually([&] { return metric(1, "vllm:num_requests_running") == 0; }, 15s));
    EXPECT_TRUE(eventually([&] { return metric(1, "kvfabric_engine_kv_push_leases") == 0; }, 15s));
    EXPECT_TRUE(eventually([&] {
      return metric(-1, "kvfabric_router_offload_prefills_total", "outcome=\"cancelled\"") == 1;
    }));
    EXPECT_EQ(metric(0, "vllm:num_requests_running"), 0);
    EXPECT_EQ(metric(0, "kvfabric_engine_requests_aborted_total"), 0);
  }

  std::string source_, bin_;
  fs::path dir_;
  IoThread io_;
  std::unique_ptr<EngineCluster> cluster_;
  std::shared_ptr<http::HttpClient> client_;
};

TEST_F(MigrationMultiprocessTest, TurnTwoIsPushedFromHolderAndTurnThreeHitsLocally) {
  startCluster("{kind: unified}");
  http::Headers session = {{"X-Session-Id", "mp-session"}};
  auto first = call("POST", "/v1/completions", prompt(4096), session);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->status, 200) << first->body;
  std::string holder(first->header("x-kvf-instance"));
  ASSERT_TRUE(eventually([&] { return indexBlocks(holder) == 256; })) << indexBlocks(holder);
  auto drain =
      call("POST", "/admin/instances/" + holder + "/drain", "", {{"Authorization", "Bearer adm"}});
  ASSERT_TRUE(drain.ok() && drain->status == 200);

  auto second = call("POST", "/v1/completions", prompt(4608), session);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->status, 200) << second->body;
  std::string decoder(second->header("x-kvf-instance"));
  ASSERT_NE(decoder, holder);
  EXPECT_EQ(second->header("x-kvf-mode"), "push_migrate");
  EXPECT_EQ(second->header("x-kvf-source"), holder);
  auto body = json::parseObject(second->body);
  ASSERT_TRUE(body.ok()) << second->body;
  EXPECT_EQ(cachedTokens(*body), 4096) << second->body;
  const auto& result = body->at("kv_transfer_result").as_object();
  // D asked for its whole prompt; C held 256 of its 287 full blocks, so the engine reports
  // "partial" (the rest was prefilled on D), which is the expected outcome for a growing session.
  std::string status(result.at("status").as_string());
  EXPECT_TRUE(status == "ok" || status == "partial") << second->body;
  EXPECT_EQ(result.at("pushed_tokens").as_int64(), 4096);
  // Exactly C's 256 blocks of payload moved.
  EXPECT_EQ(result.at("pushed_bytes").as_int64(), 256 * kPayloadBytesPerBlock);

  // D announced the migrated blocks (and its own new ones); turn 3 stays on D and hits them.
  ASSERT_TRUE(eventually([&] { return indexBlocks(decoder) >= 288; })) << indexBlocks(decoder);
  auto third = call("POST", "/v1/completions", prompt(5120), session);
  ASSERT_TRUE(third.ok());
  ASSERT_EQ(third->status, 200) << third->body;
  EXPECT_EQ(third->header("x-kvf-instance"), decoder);
  EXPECT_EQ(third->header("x-kvf-mode"), "local");
  auto third_body = json::parseObject(third->body);
  ASSERT_TRUE(third_body.ok());
  EXPECT_EQ(cachedTokens(*third_body), 4608);
  EXPECT_FALSE(third_body->contains("kv_transfer_result"));
}

TEST_F(MigrationMultiprocessTest, HeavyPrefillIsOffloadedAndClientSeesOneResponse) {
  startCluster(
      "{kind: elastic, classify: {warm_max_new_tokens: 100, medium_max_new_tokens: 1000}}");
  auto r = call("POST", "/v1/completions", prompt(4100));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->header("x-kvf-mode"), "prefill_offload");
  EXPECT_EQ(r->header("x-kvf-offload-prefill"), "ok") << readLog(cluster_->router());
  EXPECT_NE(r->header("x-kvf-source"), r->header("x-kvf-instance"));
  auto body = json::parseObject(r->body);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(cachedTokens(*body), 4096) << r->body;
  EXPECT_EQ(body->at("kv_transfer_result").as_object().at("status").as_string(), "ok");
  EXPECT_EQ(body->at("usage").as_object().at("completion_tokens").as_int64(), 4);

  // Streaming: one SSE stream from D, ending in [DONE].
  http::ClientRequest s;
  s.method = "POST";
  s.target = "/v1/completions";
  std::vector<int> t(4100);
  std::iota(t.begin(), t.end(), 90000);
  s.body = strCat(
      "{\"model\":\"test-model\",\"max_tokens\":4,\"stream\":true,"
      "\"stream_options\":{\"include_usage\":true},\"prompt\":[",
      strJoin(t, ","), "]}");
  auto events = io_.run([&]() -> asio::awaitable<absl::StatusOr<std::vector<std::string>>> {
    auto stream = co_await client_->open(s);
    if (!stream.ok()) co_return stream.status();
    if ((*stream)->header("x-kvf-mode") != "prefill_offload") {
      co_return absl::InternalError("not offloaded");
    }
    std::vector<std::string> out;
    sse::Parser parser;
    for (;;) {
      auto piece = co_await (*stream)->next();
      if (!piece.ok()) co_return piece.status();
      if (!piece->has_value()) break;
      auto st = parser.feed(**piece, [&](sse::Event&& e) { out.push_back(e.data); });
      if (!st.ok()) co_return st;
    }
    co_return out;
  });
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_FALSE(events->empty());
  EXPECT_EQ(events->back(), "[DONE]");
  bool saw_cached = false;
  for (const auto& e : *events) {
    if (e.find("\"cached_tokens\":4096") != std::string::npos) saw_cached = true;
  }
  EXPECT_TRUE(saw_cached);
}

TEST_F(MigrationMultiprocessTest, KilledPrefillInstanceFallsBackToLocalPrefillOnD) {
  // Slow health checks: the router only learns that P died from the offload itself.
  startCluster("{kind: elastic, classify: {warm_max_new_tokens: 100, medium_max_new_tokens: 1000}}",
               60);
  // The first cold request decodes on e0 (hybrid's first pick) with e1 as P; kill e1.
  cluster_->killEngine(1);
  auto r = call("POST", "/v1/completions", prompt(4100));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->header("x-kvf-mode"), "prefill_offload");
  EXPECT_EQ(r->header("x-kvf-source"), "e1");
  EXPECT_EQ(r->header("x-kvf-offload-prefill"), "error");
  auto body = json::parseObject(r->body);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(cachedTokens(*body), 0);  // D prefilled everything itself
  EXPECT_FALSE(body->contains("kv_transfer_result"));
  // The slot came back: once e1 is out of rotation (drained here; the health checks would do
  // it), the next heavy request offloads again between the survivors.
  auto drain = call("POST", "/admin/instances/e1/drain", "", {{"Authorization", "Bearer adm"}});
  ASSERT_TRUE(drain.ok() && drain->status == 200);
  auto next = call("POST", "/v1/completions", prompt(4100, false, 120000));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->status, 200);
  EXPECT_EQ(next->header("x-kvf-mode"), "prefill_offload") << next->header("x-kvf-reason");
  EXPECT_EQ(next->header("x-kvf-offload-prefill"), "ok");
}

TEST_F(MigrationMultiprocessTest, ClientLeavingCancelsThePrefillLeg) {
  clientLeavesDuringThePrefillLeg("kvfabric");
}

TEST_F(MigrationMultiprocessTest, NixlClientLeavingCancelsThePrefillLeg) {
  clientLeavesDuringThePrefillLeg("nixl");
}

// vLLM's NixlConnector dialect (kv_connector: nixl): the router sends the holder's leg first
// and D reads the blocks; the decision record names the dialect.
TEST_F(MigrationMultiprocessTest, NixlTurnTwoReadsTheHoldersBlocksAfterItsFirstLeg) {
  startCluster("{kind: unified}", 0.2, "nixl");
  http::Headers session = {{"X-Session-Id", "nixl-session"}};
  auto first = call("POST", "/v1/completions", prompt(4096), session);
  ASSERT_TRUE(first.ok() && first->status == 200);
  std::string holder(first->header("x-kvf-instance"));
  ASSERT_TRUE(eventually([&] { return indexBlocks(holder) == 256; })) << indexBlocks(holder);
  auto drain =
      call("POST", "/admin/instances/" + holder + "/drain", "", {{"Authorization", "Bearer adm"}});
  ASSERT_TRUE(drain.ok() && drain->status == 200);
  auto second = call("POST", "/v1/completions", prompt(4608), session);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->status, 200) << second->body;
  EXPECT_EQ(second->header("x-kvf-mode"), "push_migrate");
  EXPECT_EQ(second->header("x-kvf-source"), holder);
  auto body = json::parseObject(second->body);
  ASSERT_TRUE(body.ok()) << second->body;
  // C's first leg recomputed nothing past its prefix and held all 287 readable blocks; D read
  // them and verified every byte against the blocks' content.
  const auto& result = body->at("kv_transfer_result").as_object();
  EXPECT_EQ(result.at("status").as_string(), "ok") << second->body;
  EXPECT_EQ(result.at("pushed_bytes").as_int64(), 287 * kPayloadBytesPerBlock);
  EXPECT_FALSE(body->contains("kv_transfer_params"));
  // The decision record is written after the response: wait for it.
  std::string log;
  EXPECT_TRUE(eventually([&] {
    log = readFile((dir_ / "decisions.jsonl").string());
    return log.find("\"kv_connector\":\"nixl\"") != std::string::npos;
  })) << log;
}

TEST_F(MigrationMultiprocessTest, NixlHeavyPrefillIsOffloadedAndReadByD) {
  startCluster("{kind: elastic, classify: {warm_max_new_tokens: 100, medium_max_new_tokens: 1000}}",
               0.2, "nixl");
  auto r = call("POST", "/v1/completions", prompt(4100, true));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->header("x-kvf-mode"), "prefill_offload");
  EXPECT_EQ(r->header("x-kvf-offload-prefill"), "ok") << readLog(cluster_->router());
  EXPECT_NE(r->body.find("\"cached_tokens\":4096"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("\"status\":\"ok\""), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("[DONE]"), std::string::npos);
}

TEST_F(MigrationMultiprocessTest, NixlKilledPrefillInstanceFallsBackToLocalPrefillOnD) {
  startCluster("{kind: elastic, classify: {warm_max_new_tokens: 100, medium_max_new_tokens: 1000}}",
               60, "nixl");
  cluster_->killEngine(1);
  auto r = call("POST", "/v1/completions", prompt(4100));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->header("x-kvf-source"), "e1");
  EXPECT_EQ(r->header("x-kvf-offload-prefill"), "error");
  auto body = json::parseObject(r->body);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(cachedTokens(*body), 0);  // D prefilled everything itself, with no params
  EXPECT_FALSE(body->contains("kv_transfer_result"));
}

}  // namespace
}  // namespace kvf::testing
