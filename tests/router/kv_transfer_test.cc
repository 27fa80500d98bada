// The router's kv_transfer_params bodies: spliced into D's request, client copies stripped,
// the prefill request for P, P's answer validated and bounded, D's kv_transfer_result read.
#include "router/kv_transfer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/json.h"

namespace kvf::router {
namespace {

TEST(KvTransferTest, SplicesParamsIntoTheBody) {
  KvTransferParams p;
  p.source = "http://127.0.0.1:9001";
  auto body = withKvTransferParams(R"( {"model":"m","prompt":[1,2]})", false, &p);
  ASSERT_TRUE(body.ok()) << body.status();
  auto obj = json::parseObject(*body);
  ASSERT_TRUE(obj.ok()) << *body;
  EXPECT_EQ((*obj)["kv_transfer_params"].as_object()["source"].as_string(), p.source);
  EXPECT_FALSE((*obj)["kv_transfer_params"].as_object().contains("block_hashes"));
  EXPECT_EQ((*obj)["prompt"].as_array().size(), 2u);
  auto empty = withKvTransferParams("{}", false, &p);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(json::parseObject(*empty).ok()) << *empty;
  // Nothing to add and nothing to strip: unchanged.
  EXPECT_EQ(*withKvTransferParams(R"({"model":"m"})", false, nullptr), R"({"model":"m"})");
}

TEST(KvTransferTest, ClientParamsAreReplacedOrStripped) {
  std::string body = R"({"model":"m","kv_transfer_params":{"source":"http://evil:1"}})";
  auto stripped = withKvTransferParams(body, true, nullptr);
  ASSERT_TRUE(stripped.ok());
  EXPECT_EQ(stripped->find("evil"), std::string::npos);
  KvTransferParams p;
  p.source = "http://127.0.0.1:2";
  p.block_hashes = std::vector<protocol::EngineBlockHash>{
      protocol::EngineBlockHash(1), protocol::EngineBlockHash(18446744073709551615ull)};
  p.lease_id = "lease-9";
  auto replaced = withKvTransferParams(body, true, &p);
  ASSERT_TRUE(replaced.ok());
  auto obj = json::parseObject(*replaced);
  ASSERT_TRUE(obj.ok());
  auto params = (*obj)["kv_transfer_params"].as_object();
  EXPECT_EQ(params["source"].as_string(), "http://127.0.0.1:2");
  EXPECT_EQ(params["block_hashes"].as_array()[1].as_uint64(), 18446744073709551615ull);
  EXPECT_EQ(params["lease_id"].as_string(), "lease-9");
}

TEST(KvTransferTest, PrefillBodyIsOneTokenNonStreamingWithRemoteDecode) {
  auto body = remotePrefillBody(
      R"({"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":200,
          "max_completion_tokens":300,"min_tokens":200,"n":2,
          "messages":[{"role":"user","content":"hi"}]})",
      5000);
  ASSERT_TRUE(body.ok());
  auto obj = json::parseObject(*body);
  ASSERT_TRUE(obj.ok());
  EXPECT_FALSE((*obj)["stream"].as_bool());
  EXPECT_FALSE(obj->contains("stream_options"));
  EXPECT_FALSE(obj->contains("max_completion_tokens"));
  EXPECT_FALSE(obj->contains("min_tokens"));
  EXPECT_EQ((*obj)["max_tokens"].as_int64(), 1);
  EXPECT_EQ((*obj)["n"].as_int64(), 1);
  EXPECT_TRUE((*obj)["kv_transfer_params"].as_object()["do_remote_decode"].as_bool());
  EXPECT_EQ((*obj)["kv_transfer_params"].as_object()["lease_ms"].as_int64(), 5000);
  EXPECT_EQ((*obj)["messages"].as_array().size(), 1u);
}

TEST(KvTransferTest, PrefillResponseIsValidatedAndSourceIsOurs) {
  auto ok = parseRemotePrefillResponse(
      R"({"choices":[],"kv_transfer_params":{"source":"http://elsewhere:1",
          "block_hashes":[5,18446744073709551615],"lease_id":"l1"}})",
      "http://127.0.0.1:7000");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->source, "http://127.0.0.1:7000");
  EXPECT_EQ(ok->block_hashes,
            (std::vector<protocol::EngineBlockHash>{
                protocol::EngineBlockHash(5), protocol::EngineBlockHash(18446744073709551615ull)}));
  EXPECT_EQ(ok->lease_id, "l1");
  for (std::string bad :
       {R"({"choices":[]})", R"({"kv_transfer_params":{"block_hashes":[]}})",
        R"({"kv_transfer_params":{"block_hashes":[-1]}})",
        R"({"kv_transfer_params":{"block_hashes":"x"}})",
        R"({"kv_transfer_params":{"block_hashes":[1],"lease_id":7}})", "not json"}) {
    EXPECT_FALSE(parseRemotePrefillResponse(bad, "http://h:1").ok()) << bad;
  }
  std::string long_lease =
      R"({"kv_transfer_params":{"block_hashes":[1],"lease_id":")" + std::string(300, 'x') + "\"}}";
  EXPECT_FALSE(parseRemotePrefillResponse(long_lease, "http://h:1").ok());
}

TEST(KvTransferTest, ReadsCachedTokensAndTransferResult) {
  auto r = readResponseReport(
      R"({"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":8}},
          "kv_transfer_result":{"status":"partial","pushed_tokens":4,"pushed_bytes":400,
          "reason":"evicted"}})");
  ASSERT_TRUE(r.cached_tokens.has_value());
  EXPECT_EQ(*r.cached_tokens, 8);
  ASSERT_TRUE(r.transfer.has_value());
  EXPECT_EQ(r.transfer->outcome, TransferOutcome::kPartial);
  EXPECT_EQ(r.transfer->pushed_tokens, 4);
  EXPECT_EQ(r.transfer->pushed_bytes, 400);
  EXPECT_EQ(r.transfer->reason, "evicted");
  auto none = readResponseReport(R"({"choices":[{"text":"usage"}]})");
  EXPECT_FALSE(none.cached_tokens.has_value());
  EXPECT_FALSE(none.transfer.has_value());
  auto no_details = readResponseReport(R"({"usage":{"prompt_tokens":3}})");
  EXPECT_EQ(no_details.cached_tokens.value_or(-1), 0);
}

// vLLM's NixlConnector legs, against the bodies vLLM's toy_proxy_server sends
// (tests/fixtures/vllm/nixl/, written by an independent generator).
const NixlSideChannel kFixtureSideChannel{"192.0.2.10", 5600};  // P's, in the fixtures

boost::json::object nixlFixture(const std::string& name) {
  std::string dir =
      std::string(std::getenv("KVF_SOURCE_DIR") ? std::getenv("KVF_SOURCE_DIR") : ".");
  std::ifstream in(dir + "/tests/fixtures/vllm/nixl/" + name);
  std::stringstream text;
  text << in.rdbuf();
  auto obj = json::parseObject(text.str());
  EXPECT_TRUE(obj.ok()) << name << ": " << obj.status();
  return obj.ok() ? *obj : boost::json::object();
}

TEST(KvTransferTest, NixlFirstLegIsToyProxyServersPrefillLeg) {
  for (const std::string kind : {"completion", "chat"}) {
    auto client = nixlFixture("client_" + kind + ".json");
    auto want = nixlFixture("p_leg_" + kind + ".json");
    ASSERT_FALSE(client.empty());
    auto body = nixlPrefillBody(boost::json::serialize(client.at("body")));
    ASSERT_TRUE(body.ok()) << body.status();
    auto got = json::parseObject(*body);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(*got, want.at("body").as_object()) << kind << ": " << *body;
  }
}

TEST(KvTransferTest, NixlSecondLegCarriesPsAnswerUnchanged) {
  for (const std::string version :
       {"v0.9.0", "v0.9.2", "v0.13.0", "v0.18.0", "v0.18.0-stop", "v0.21.0", "main"}) {
    for (const std::string kind : {"completion", "chat"}) {
      const std::string name = version + "_" + kind;
      auto client = nixlFixture("client_" + kind + ".json");
      auto answer = nixlFixture("p_response_" + name + ".json");
      auto want = nixlFixture("d_leg_" + name + ".json");
      auto params = parseNixlPrefillResponse(boost::json::serialize(answer), kFixtureSideChannel);
      // D (v0.13+) needs remote_request_id; null means P kept nothing: D prefills locally.
      const bool readable = version != "v0.9.0" && version != "v0.9.2" && version != "v0.18.0-stop";
      ASSERT_EQ(params.ok(), readable) << name << ": " << params.status();
      if (!readable) {
        EXPECT_EQ(params.status().code(), absl::StatusCode::kInvalidArgument);
        continue;
      }
      auto body = withRawKvTransferParams(boost::json::serialize(client.at("body")), *params);
      ASSERT_TRUE(body.ok());
      auto got = json::parseObject(*body);
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(*got, want.at("body").as_object()) << name;
    }
  }
}

TEST(KvTransferTest, NixlAnswerMissingAFieldIsRefusedNamingIt) {
  auto answer = nixlFixture("p_response_v0.21.0_completion.json");
  for (const char* field : {"remote_block_ids", "remote_engine_id", "remote_request_id",
                            "remote_host", "remote_port"}) {
    auto damaged = answer;
    damaged.at("kv_transfer_params").as_object().erase(field);
    auto params = parseNixlPrefillResponse(boost::json::serialize(damaged), kFixtureSideChannel);
    ASSERT_FALSE(params.ok()) << field;
    EXPECT_NE(std::string(params.status().message()).find(field), std::string::npos)
        << params.status();
  }
  answer["kv_transfer_params"] = nullptr;
  EXPECT_FALSE(parseNixlPrefillResponse(boost::json::serialize(answer), kFixtureSideChannel).ok());
}

TEST(KvTransferTest, NixlAnswerNamingAnotherSideChannelIsRefused) {
  const std::string answer =
      boost::json::serialize(nixlFixture("p_response_v0.21.0_completion.json"));
  // P may not send D (and D's worker token) anywhere the registry does not name.
  for (const NixlSideChannel& registry :
       {NixlSideChannel{"192.0.2.11", 5600}, NixlSideChannel{"192.0.2.10", 5601},
        NixlSideChannel{"192.0.2.11", std::nullopt}}) {
    auto params = parseNixlPrefillResponse(answer, registry);
    ASSERT_FALSE(params.ok()) << registry.host;
    EXPECT_EQ(params.status().code(), absl::StatusCode::kPermissionDenied) << params.status();
  }
  // Without a worker_url only the host is named, and any port on it is P's.
  EXPECT_TRUE(parseNixlPrefillResponse(answer, {"192.0.2.10", std::nullopt}).ok());

  InstanceConfig with_worker;
  with_worker.host = "192.0.2.10";
  with_worker.worker_url = "http://192.0.2.12:7000";
  NixlSideChannel named = nixlSideChannel(with_worker);
  EXPECT_EQ(named.host, "192.0.2.12");
  EXPECT_EQ(named.port, std::optional<uint16_t>(7000));
  InstanceConfig without_worker;
  without_worker.host = "192.0.2.10";
  EXPECT_EQ(nixlSideChannel(without_worker).port, std::nullopt);
}

}  // namespace
}  // namespace kvf::router
