// The router's kv_transfer_params bodies: spliced into D's request, client copies stripped,
// the prefill request for P, P's answer validated and bounded, D's kv_transfer_result read.
#include "router/kv_transfer.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvf::router
