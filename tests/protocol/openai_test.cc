// kv_transfer_params and kv_transfer_result: one parse and one serialize that round-trip, bound
// what a peer sends and name the field in errors; transfer outcomes have one set of wire names.
#include "protocol/openai.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

namespace kvf::protocol {
namespace {

namespace bj = boost::json;

bj::value parse(std::string_view text) { return bj::parse(text); }

TEST(OpenAiProtocolTest, KvTransferParamsRoundTrip) {
  KvTransferParams receiver;
  receiver.source = "http://10.0.0.3:7100";
  receiver.block_hashes =
      std::vector<EngineBlockHash>{EngineBlockHash(5), EngineBlockHash(~uint64_t{0})};
  receiver.lease_id = "cmpl-p-3";
  receiver.deadline_ms = 800;
  KvTransferParams prefill;
  prefill.do_remote_decode = true;
  prefill.lease_ms = 5000;
  for (const KvTransferParams& p : {receiver, prefill, KvTransferParams{}}) {
    auto back = parseKvTransferParams(bj::value(kvTransferParamsJson(p)), {});
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, p);
  }
  EXPECT_TRUE(receiver.namesTransfer());
  EXPECT_TRUE(prefill.namesTransfer());
  EXPECT_FALSE(KvTransferParams{}.namesTransfer());
  // Members vLLM's connectors add are ignored; an empty list is not an absent one.
  auto other = parseKvTransferParams(parse(R"({"remote_engine_id":"e3","block_hashes":[]})"), {});
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->block_hashes.has_value() && other->block_hashes->empty());
  EXPECT_EQ(parseKvTransferParams(parse(R"({"deadline_ms":1e3})"), {})->deadline_ms, 1000);
}

TEST(OpenAiProtocolTest, KvTransferParamsErrorsNameTheField) {
  auto error = [](std::string_view body, const KvTransferLimits& limits = {}) {
    auto r = parseKvTransferParams(parse(body), limits);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  EXPECT_EQ(error(R"("x")"), "kv_transfer_params: must be an object");
  EXPECT_NE(error(R"({"source":3})").find("kv_transfer_params.source"), std::string::npos);
  EXPECT_NE(error(R"({"source":")" + std::string(600, 'h') + "\"}").find("longer than 512"),
            std::string::npos);
  EXPECT_NE(error(R"({"block_hashes":[1,-2]})").find("kv_transfer_params.block_hashes[1]"),
            std::string::npos);
  EXPECT_NE(error(R"({"block_hashes":"x"})").find("must be an array"), std::string::npos);
  KvTransferLimits two;
  two.max_block_hashes = 2;
  EXPECT_NE(error(R"({"block_hashes":[1,2,3]})", two).find("exceed the limit of 2"),
            std::string::npos);
  EXPECT_NE(error(R"({"lease_id":7})").find("kv_transfer_params.lease_id"), std::string::npos);
  EXPECT_NE(error(R"({"deadline_ms":60001})").find("kv_transfer_params.deadline_ms"),
            std::string::npos);
  EXPECT_NE(error(R"({"deadline_ms":1.5})").find("must be an integer"), std::string::npos);
  EXPECT_NE(error(R"({"lease_ms":-1})").find("kv_transfer_params.lease_ms"), std::string::npos);
  EXPECT_NE(error(R"({"do_remote_decode":"yes"})").find("do_remote_decode"), std::string::npos);
  EXPECT_NE(error(R"({"do_remote_decode":true,"source":"http://h:1"})").find("exclusive"),
            std::string::npos);
}

TEST(OpenAiProtocolTest, TransferOutcomesHaveOneSetOfNames) {
  for (TransferOutcome o :
       {TransferOutcome::kOk, TransferOutcome::kPartial, TransferOutcome::kFallback}) {
    EXPECT_EQ(parseTransferOutcome(transferOutcomeName(o)), o);
  }
  EXPECT_EQ(transferOutcomeName(TransferOutcome::kPartial), "partial");
  // A name from a newer peer is not mistaken for a known one.
  EXPECT_EQ(parseTransferOutcome("deferred"), TransferOutcome::kUnknown);
  EXPECT_EQ(parseTransferOutcome("OK"), TransferOutcome::kUnknown);
  EXPECT_EQ(transferOutcomeName(TransferOutcome::kUnknown), "unknown");
  EXPECT_EQ(transferOutcomeFor(0, 5), TransferOutcome::kFallback);
  EXPECT_EQ(transferOutcomeFor(3, 5), TransferOutcome::kPartial);
  EXPECT_EQ(transferOutcomeFor(5, 5), TransferOutcome::kOk);
}

TEST(OpenAiProtocolTest, KvTransferResultRoundTripsAndReadsPeersLeniently) {
  KvTransferResult r;
  r.outcome = TransferOutcome::kPartial;
  r.pushed_tokens = 4000;
  r.pushed_bytes = 64000;
  r.requested_tokens = 4096;
  r.reason = "source held 250 of 256 blocks";
  EXPECT_EQ(parseKvTransferResult(kvTransferResultJson(r)), r);
  r.reason.clear();
  bj::object no_reason = kvTransferResultJson(r);
  EXPECT_FALSE(no_reason.contains("reason"));
  EXPECT_EQ(parseKvTransferResult(no_reason), r);
  EXPECT_EQ(parseKvTransferResult(parse(R"({"pushed_tokens":1})").as_object()), std::nullopt);
  EXPECT_EQ(parseKvTransferResult(parse(R"({"status":""})").as_object()), std::nullopt);
  auto odd = parseKvTransferResult(
      parse(R"({"status":"later","pushed_tokens":"x","reason":")" + std::string(400, 'r') + "\"}")
          .as_object());
  ASSERT_TRUE(odd.has_value());
  EXPECT_EQ(odd->outcome, TransferOutcome::kUnknown);
  EXPECT_EQ(odd->pushed_tokens, 0);
  EXPECT_EQ(odd->reason.size(), kMaxTransferReasonBytes);
  EXPECT_EQ(apiPath(ApiKind::kChat), "/v1/chat/completions");
  EXPECT_EQ(apiPath(ApiKind::kCompletions), "/v1/completions");
}

TEST(OpenAiProtocolTest, NixlRemoteParamsReadFlatAndGroupedAndRoundTrip) {
  KvTransferLimits limits;
  auto flat = parseNixlRemoteParams(
      parse(R"({"remote_block_ids":[3,4],"remote_engine_id":"e","remote_host":"h",)"
            R"("remote_port":5600})"),
      limits, /*require_request_id=*/false);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(flat->remote_block_ids, (std::vector<std::vector<uint64_t>>{{3, 4}}));
  EXPECT_EQ(flat->remote_num_tokens, -1);
  NixlRemoteParams p;
  p.remote_engine_id = "e";
  p.remote_block_ids = {{1, 2, 3}, {9}};
  p.remote_request_id = "cmpl-x-0";
  p.remote_host = "10.0.0.1";
  p.remote_port = 5601;
  p.remote_num_tokens = 48;
  auto back = parseNixlRemoteParams(bj::value(nixlRemoteParamsJson(p)), limits);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
  EXPECT_TRUE(isNixlDecodeLeg(bj::value(nixlRemoteParamsJson(p))));
  EXPECT_FALSE(isNixlDecodeLeg(bj::value(nixlPrefillLegParams())));
}

TEST(OpenAiProtocolTest, NixlRemoteParamsErrorsNameTheField) {
  KvTransferLimits limits;
  auto code = [&](std::string_view text) {
    auto r = parseNixlRemoteParams(parse(text), limits);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  const std::string base =
      R"("remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":1)";
  EXPECT_NE(code("{" + base + "}").find("remote_block_ids"), std::string::npos);
  EXPECT_NE(code(R"({"remote_block_ids":[-1],)" + base + "}").find("remote_block_ids[0]"),
            std::string::npos);
  EXPECT_NE(code(R"({"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h",)"
                 R"("remote_port":1})")
                .find("remote_request_id"),
            std::string::npos);
  EXPECT_NE(code(R"({"remote_block_ids":[1],"remote_engine_id":"e","remote_request_id":"r",)"
                 R"("remote_host":"h","remote_port":70000})")
                .find("remote_port"),
            std::string::npos);
  EXPECT_EQ(code(R"({"remote_block_ids":[1],)" + base + "}"), "ok");
}

}  // namespace
}  // namespace kvf::protocol
