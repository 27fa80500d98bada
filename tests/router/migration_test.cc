// KV movement through the router against fake engines that speak the push contract: the body
// each engine receives (kv_transfer_params for D and for P), pass-through of D's response
// (streaming too), headers, decision log and metrics, fallbacks when P fails, times out or
// answers nonsense, the offload cap given back on every path, and client-supplied
// kv_transfer_params stripped.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>

#include "tests/router/router_fixture.h"

namespace kvf::router {
namespace {

class MigrationTest : public RouterFixture {
 protected:
  int engineIndex(std::string_view id) {
    for (size_t i = 0; i < engines_.size(); ++i) {
      if (engines_[i]->options().id == id) return static_cast<int>(i);
    }
    return -1;
  }

  // The kv_transfer_params the engine received with its last completion (empty if none).
  bj::object lastParams(int engine) {
    auto bodies = engines_[engine]->receivedBodies();
    if (bodies.empty()) return {};
    auto body = json::parseObject(bodies.back());
    if (!body.ok() || !body->contains("kv_transfer_params")) return {};
    return body->at("kv_transfer_params").as_object();
  }

  bj::object lastBody(int engine) {
    auto bodies = engines_[engine]->receivedBodies();
    auto body = json::parseObject(bodies.empty() ? "{}" : bodies.back());
    return body.ok() ? *body : bj::object{};
  }

  std::string metrics() {
    auto m = call(get("/metrics"));
    return m.ok() ? m->body : "";
  }

  bool released() {
    return eventually([&] {
      if (metrics().find("kvfabric_router_offloads_in_flight 0\n") == std::string::npos) {
        return false;
      }
      for (auto& e : engines_) {
        auto state = instanceState(e->options().id);
        if (state["running"].as_int64() != 0 || state["pending_prefill_tokens"].as_int64() != 0) {
          return false;
        }
      }
      return true;
    });
  }

  // Waits until the router's index shows the holder's copy of a session prefix (`blocks`
  // 16-token blocks), then drains the holder, so the session's next turn must move the prefix.
  void drainHolder(const std::string& holder, int64_t blocks) {
    ASSERT_TRUE(
        eventually([&] { return instanceState(holder)["index_blocks"].as_int64() == blocks; }));
    auto drained = call(
        post("/admin/instances/" + holder + "/drain", "", {{"Authorization", "Bearer s3cret"}}));
    ASSERT_TRUE(drained.ok()) << drained.status();
    ASSERT_EQ(drained->status, 200);
  }

  // Elastic on two push-capable engines: every 4096-token cold prompt is HEAVY.
  void startElastic(std::string elastic_yaml = "{}") {
    workers_ = true;
    start(2,
          "{kind: elastic, classify: {warm_max_new_tokens: 100, medium_max_new_tokens: 1000}, "
          "elastic: " +
              elastic_yaml + "}");
  }
};

TEST_F(MigrationTest, DrainedHolderPushesSessionPrefixToNewInstance) {
  workers_ = true;
  start(3, "{kind: unified}");
  waitSubscribed();
  http::Headers session = {{"X-Session-Id", "s1"}};
  auto first = call(post("/v1/completions", tokenPrompt(0, 4096), session));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->header("x-kvf-mode"), "local");
  EXPECT_EQ(first->header("x-kvf-reason"), "cold");
  EXPECT_EQ(first->header("x-kvf-source"), "");
  std::string holder(first->header("x-kvf-instance"));
  ASSERT_NO_FATAL_FAILURE(drainHolder(holder, 256));

  auto second = call(post("/v1/completions", tokenPrompt(0, 4608), session));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->status, 200) << second->body;
  std::string decoder(second->header("x-kvf-instance"));
  EXPECT_NE(decoder, holder);
  EXPECT_EQ(second->header("x-kvf-mode"), "push_migrate");
  EXPECT_EQ(second->header("x-kvf-source"), holder);
  EXPECT_EQ(second->header("x-kvf-predicted-cached-tokens"), "4096");
  // D was told where to pull from (block_hashes omitted: D hashes its own prompt).
  bj::object params = lastParams(engineIndex(decoder));
  EXPECT_EQ(params["source"].as_string(), engines_[engineIndex(holder)]->workerUrl());
  EXPECT_FALSE(params.contains("block_hashes"));
  // D's response is passed through unchanged: its usage counts the pushed tokens.
  auto body = json::parseObject(second->body);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ((*body)["kv_transfer_result"].as_object()["status"].as_string(), "ok");
  EXPECT_EQ((*body)["choices"].as_array()[0].as_object()["text"].as_string(), "ok from " + decoder);

  // Turn 3 hits the migrated blocks on D locally (D's KV events announced them).
  ASSERT_TRUE(eventually([&] { return instanceState(decoder)["index_blocks"].as_int64() == 288; }));
  auto third = call(post("/v1/completions", tokenPrompt(0, 5120), session));
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->header("x-kvf-instance"), decoder);
  EXPECT_EQ(third->header("x-kvf-mode"), "local");
  EXPECT_EQ(third->header("x-kvf-predicted-cached-tokens"), "4608");
  EXPECT_TRUE(lastParams(engineIndex(decoder)).empty());

  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 3; }));
  auto log = decisionLog();
  EXPECT_EQ(log[1]["mode"].as_string(), "push_migrate");
  EXPECT_EQ(log[1]["source"].as_string(), holder);
  EXPECT_EQ(log[1]["actual_cached_tokens"].as_int64(), 4096);
  EXPECT_EQ(log[1]["transfer"].as_object()["status"].as_string(), "ok");
  EXPECT_EQ(log[1]["transfer"].as_object()["pushed_tokens"].as_int64(), 4096);
  auto costs = log[1]["predicted_costs"].as_object();
  EXPECT_GT(costs["push_migrate"].as_double(), 0.0);
  EXPECT_DOUBLE_EQ(costs["chosen"].as_double(), costs["push_migrate"].as_double());
  EXPECT_TRUE(costs["prefill_offload"].is_null());
  EXPECT_TRUE(log[2]["source"].is_null());
  bj::object modes = adminInstances()["decisions_by_mode"].as_object();
  EXPECT_EQ(modes["local"].as_int64(), 2);
  EXPECT_EQ(modes["push_migrate"].as_int64(), 1);
  EXPECT_EQ(modes["prefill_offload"].as_int64(), 0);
  std::string m = metrics();
  EXPECT_NE(m.find("kvfabric_router_decisions_total{policy=\"unified\",mode=\"push_migrate\","
                   "reason=\"push_migrate\"} 1"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("kvfabric_router_kv_transfers_total{mode=\"push_migrate\",status=\"ok\"} 1"),
            std::string::npos);
  EXPECT_NE(m.find("kvfabric_router_kv_pushed_tokens_total 4096"), std::string::npos);
}

TEST_F(MigrationTest, StreamingPushMigrateRelaysTheDecodersStream) {
  workers_ = true;
  start(2, "{kind: unified}");
  waitSubscribed();
  auto first = call(post("/v1/completions", tokenPrompt(0, 2048), {{"X-Session-Id", "s"}}));
  ASSERT_TRUE(first.ok());
  std::string holder(first->header("x-kvf-instance"));
  ASSERT_NO_FATAL_FAILURE(drainHolder(holder, 128));
  auto result =
      stream(post("/v1/completions", tokenPrompt(0, 2100, true), {{"X-Session-Id", "s"}}));
  ASSERT_TRUE(result.ok()) << result.status();
  auto& [headers, events] = *result;
  EXPECT_EQ(http::findHeader(headers, "x-kvf-mode"), "push_migrate");
  EXPECT_EQ(http::findHeader(headers, "x-kvf-source"), holder);
  ASSERT_EQ(events.size(), 6u);  // 4 tokens, usage (+ kv_transfer_result), [DONE]
  EXPECT_NE(events[4].find("\"kv_transfer_result\""), std::string::npos) << events[4];
  EXPECT_EQ(events[5], "[DONE]");
  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 2; }));
  EXPECT_EQ(decisionLog()[1]["actual_cached_tokens"].as_int64(), 2048);
  EXPECT_EQ(decisionLog()[1]["transfer"].as_object()["status"].as_string(), "ok");
}

TEST_F(MigrationTest, OffloadSendsPrefillToPThenParamsToD) {
  startElastic("{lease_ms: 7000}");
  auto r = call(post("/v1/completions", tokenPrompt(0, 4100)));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->header("x-kvf-mode"), "prefill_offload");
  EXPECT_EQ(r->header("x-kvf-reason"), "heavy_offload");
  EXPECT_EQ(r->header("x-kvf-offload-prefill"), "ok");
  std::string decoder(r->header("x-kvf-instance"));
  std::string prefill(r->header("x-kvf-source"));
  ASSERT_NE(decoder, prefill);
  EXPECT_EQ(r->header("x-kvf-predicted-cached-tokens"), "4096");
  // P: non-streaming, one token, do_remote_decode with the lease.
  bj::object p_body = lastBody(engineIndex(prefill));
  EXPECT_EQ(p_body["max_tokens"].as_int64(), 1);
  EXPECT_FALSE(p_body["stream"].as_bool());
  EXPECT_TRUE(p_body["kv_transfer_params"].as_object()["do_remote_decode"].as_bool());
  EXPECT_EQ(p_body["kv_transfer_params"].as_object()["lease_ms"].as_int64(), 7000);
  // D: the client's request (max_tokens 4) with P's params.
  bj::object d_body = lastBody(engineIndex(decoder));
  EXPECT_EQ(d_body["max_tokens"].as_int64(), 4);
  bj::object params = d_body["kv_transfer_params"].as_object();
  EXPECT_EQ(params["source"].as_string(), engines_[engineIndex(prefill)]->workerUrl());
  EXPECT_EQ(params["block_hashes"].as_array().size(), 256u);
  EXPECT_EQ(params["lease_id"].as_string(), "lease-1");
  // One response, D's, with the pushed prefix counted.
  auto body = json::parseObject(r->body);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ((*body)["choices"].as_array()[0].as_object()["text"].as_string(), "ok from " + decoder);
  EXPECT_EQ(
      (*body)["usage"].as_object()["prompt_tokens_details"].as_object()["cached_tokens"].as_int64(),
      4096);
  EXPECT_FALSE(body->contains("kv_transfer_params"));
  EXPECT_TRUE(released());
  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 1; }));
  auto log = decisionLog()[0];
  EXPECT_EQ(log["mode"].as_string(), "prefill_offload");
  EXPECT_EQ(log["source"].as_string(), prefill);
  EXPECT_EQ(log["offload_prefill"].as_string(), "ok");
  EXPECT_GT(log["ttft_s"].as_double(), 0.0);
  EXPECT_LE(log["ttft_s"].as_double(), log["duration_s"].as_double());
  // P's leg is part of the time to first token.
  EXPECT_GT(log["peer_leg_s"].as_double(), 0.0);
  EXPECT_LT(log["peer_leg_s"].as_double(), log["ttft_s"].as_double());
  EXPECT_EQ(log["class"].as_string(), "heavy");
  EXPECT_GT(log["predicted_costs"].as_object()["prefill_offload"].as_double(), 0.0);
  EXPECT_GT(log["predicted_costs"].as_object()["local"].as_double(), 0.0);
  std::string m = metrics();
  EXPECT_NE(m.find("kvfabric_router_offload_prefills_total{outcome=\"ok\"} 1"), std::string::npos);
  EXPECT_NE(m.find("kvfabric_router_kv_transfers_total{mode=\"prefill_offload\",status=\"ok\"} 1"),
            std::string::npos)
      << m;
}

TEST_F(MigrationTest, StreamingOffloadGivesTheClientOneStream) {
  startElastic();
  auto result = stream(post("/v1/completions", tokenPrompt(0, 4096, true)));
  ASSERT_TRUE(result.ok()) << result.status();
  auto& [headers, events] = *result;
  EXPECT_EQ(http::findHeader(headers, "x-kvf-mode"), "prefill_offload");
  EXPECT_EQ(http::findHeader(headers, "x-kvf-offload-prefill"), "ok");
  // Block-aligned prompt: the engine computes the last token, so one block less is predicted.
  EXPECT_EQ(http::findHeader(headers, "x-kvf-predicted-cached-tokens"), "4080");
  ASSERT_EQ(events.size(), 6u);
  EXPECT_NE(events[0].find("\"t0\""), std::string::npos);
  EXPECT_EQ(events[5], "[DONE]");
  std::string prefill(http::findHeader(headers, "x-kvf-source"));
  EXPECT_FALSE(lastBody(engineIndex(prefill))["stream"].as_bool());
  EXPECT_FALSE(lastBody(engineIndex(prefill)).contains("stream_options"));
  EXPECT_TRUE(released());
}

TEST_F(MigrationTest, FailedSlowOrConfusedPrefillFallsBackToLocalDecode) {
  startElastic("{prefill_timeout_s: 0.3, max_concurrent_offloads: 1}");
  struct Case {
    std::function<void(fakes::FakeEngine&)> breakIt;
    std::string outcome;
  };
  std::vector<Case> cases = {
      {[](fakes::FakeEngine& e) { e.remote_decode_status = 503; }, "error"},
      {[](fakes::FakeEngine& e) { e.remote_decode_delay_ms = 2000; }, "timeout"},
      {[](fakes::FakeEngine& e) { e.remote_decode_bad_params = true; }, "bad_response"}};
  int n = 0;
  for (const auto& c : cases) {
    for (auto& e : engines_) c.breakIt(*e);
    // A fresh prompt each time, so no engine holds it.
    auto r = call(post("/v1/completions", tokenPrompt(100000 * ++n, 4096)));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->header("x-kvf-mode"), "prefill_offload");
    EXPECT_EQ(r->header("x-kvf-offload-prefill"), c.outcome);
    std::string decoder(r->header("x-kvf-instance"));
    EXPECT_TRUE(lastParams(engineIndex(decoder)).empty()) << c.outcome;  // plain local prefill
    EXPECT_EQ(r->header("x-kvf-predicted-cached-tokens"), "0");
    EXPECT_TRUE(released()) << c.outcome;  // with a cap of 1, the next case offloads again
    for (auto& e : engines_) {
      e->remote_decode_status = 200;
      e->remote_decode_delay_ms = 0;
      e->remote_decode_bad_params = false;
    }
  }
  auto ok = call(post("/v1/completions", tokenPrompt(900000, 4096)));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->header("x-kvf-offload-prefill"), "ok");
  std::string m = metrics();
  for (const char* outcome : {"error", "timeout", "bad_response", "ok"}) {
    EXPECT_NE(m.find(strCat("kvfabric_router_offload_prefills_total{outcome=\"", outcome, "\"} 1")),
              std::string::npos)
        << outcome << "\n"
        << m;
  }
  EXPECT_NE(m.find("kvfabric_router_kv_transfers_total{mode=\"prefill_offload\",status=\"ok\"} 1"),
            std::string::npos);
}

TEST_F(MigrationTest, ClientKvTransferParamsAreStripped) {
  workers_ = true;
  start(2, "{kind: round_robin}");
  // A client may not point an engine at a peer of its choosing.
  auto r =
      call(post("/v1/completions",
                tokenPrompt(0, 64, false, ",\"kv_transfer_params\":{\"source\":\"http://x:1\"}")));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  std::string served(r->header("x-kvf-instance"));
  EXPECT_TRUE(lastParams(engineIndex(served)).empty());
  EXPECT_EQ(lastBody(engineIndex(served))["max_tokens"].as_int64(), 4);
}

// The key spelled with JSON escapes is the same key to every JSON parser (the engine's too): a
// text search misses it, so stripping must work on the parsed document, on every parse path.
TEST_F(MigrationTest, EscapedClientKvTransferParamsAreStripped) {
  workers_ = true;
  start(2, "{kind: round_robin}");
  const std::string evil = R"("source":"http://127.0.0.1:1","do_remote_decode":false)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/completions",  // token ids: the single-pass parse declines escaped keys
       tokenPrompt(0, 64, false, ",\"kv_transfer\\u005fparams\":{" + evil + "}")},
      {"/v1/completions",  // text prompt
       R"({"model":"fake-model","max_tokens":4,"prompt":"hello","kv_transfer\u005Fparams":{)" +
           evil + "}}"},
      {"/v1/completions",  // every character escaped
       R"({"model":"fake-model","max_tokens":4,"prompt":[1,2,3],)"
       R"("\u006b\u0076\u005f\u0074\u0072\u0061\u006e\u0073\u0066\u0065\u0072)"
       R"(\u005f\u0070\u0061\u0072\u0061\u006d\u0073":{)" +
           evil + "}}"},
      {"/v1/chat/completions",
       R"({"model":"fake-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}],)"
       R"("kv\u005ftransfer_params":{)" +
           evil + "}}"},
  };
  for (const auto& [target, body] : cases) {
    auto r = call(post(target, body));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 200) << body;
    std::string served(r->header("x-kvf-instance"));
    ASSERT_GE(engineIndex(served), 0);
    EXPECT_TRUE(lastParams(engineIndex(served)).empty()) << target << " " << body;
  }
}

TEST_F(MigrationTest, PushFallbackOnTheDecoderIsCounted) {
  workers_ = true;
  start(2, "{kind: unified}");
  waitSubscribed();
  auto first = call(post("/v1/completions", tokenPrompt(0, 2048), {{"X-Session-Id", "s"}}));
  ASSERT_TRUE(first.ok());
  std::string holder(first->header("x-kvf-instance"));
  for (auto& e : engines_) e->remote_kv_fails = true;
  ASSERT_NO_FATAL_FAILURE(drainHolder(holder, 128));
  auto second = call(post("/v1/completions", tokenPrompt(0, 2100), {{"X-Session-Id", "s"}}));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->status, 200);
  EXPECT_EQ(second->header("x-kvf-mode"), "push_migrate");
  ASSERT_TRUE(eventually([&] { return decisionLog().size() == 2; }));
  auto log = decisionLog()[1];
  EXPECT_EQ(log["transfer"].as_object()["status"].as_string(), "fallback");
  EXPECT_EQ(log["actual_cached_tokens"].as_int64(), 0);
  std::string m = metrics();
  EXPECT_NE(
      m.find("kvfabric_router_kv_transfers_total{mode=\"push_migrate\",status=\"fallback\"} 1"),
      std::string::npos);
  EXPECT_NE(m.find("kvfabric_router_cache_silent_misses_total 1"), std::string::npos);
}

TEST_F(MigrationTest, CapLimitsConcurrentOffloadsAndAbandonedOffloadsGiveItBack) {
  startElastic("{max_concurrent_offloads: 1}");
  for (auto& e : engines_) e->remote_decode_delay_ms = 400;
  // Two heavy requests at once: the first takes the only slot, the second prefills locally.
  auto spawn = [&](int base) {
    http::ClientRequest r = post("/v1/completions", tokenPrompt(base, 4096));
    return asio::co_spawn(
        engine_io_.context(),
        [this, r]() -> asio::awaitable<absl::StatusOr<http::Response>> {
          co_return co_await client_->request(r);
        },
        asio::use_future);
  };
  auto a = spawn(0);
  ASSERT_TRUE(eventually([&] {  // the first is waiting on P
    return metrics().find("kvfabric_router_offloads_in_flight 1\n") != std::string::npos;
  }));
  auto b = spawn(500000);
  auto ra = a.get();
  auto rb = b.get();
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->header("x-kvf-mode"), "prefill_offload");
  EXPECT_EQ(rb->header("x-kvf-mode"), "local");
  EXPECT_EQ(rb->header("x-kvf-reason"), "offload_cap");
  EXPECT_TRUE(released());
  // A client that hangs up while P prefills: the slot still comes back.
  http::ClientRequest r = post("/v1/completions", tokenPrompt(900000, 4096, true));
  auto hung_up = engine_io_.run([&]() -> asio::awaitable<absl::Status> {
    auto s = co_await client_->open(r);  // returns at response headers, after P
    if (s.ok()) (*s)->cancel();
    co_return s.status();
  });
  EXPECT_TRUE(hung_up.ok()) << hung_up;
  EXPECT_TRUE(released());
  auto next = call(post("/v1/completions", tokenPrompt(700000, 4096)));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->header("x-kvf-mode"), "prefill_offload");
}

}  // namespace
}  // namespace kvf::router
