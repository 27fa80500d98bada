#include "protocol/push.h"

#include <gtest/gtest.h>

namespace kvf::protocol {
namespace {

PushRequest sample() {
  PushRequest r;
  r.request_id = "cmpl-d-1";
  r.receiver_url = "http://10.0.0.7:9001";
  r.block_hashes = {EngineBlockHash(1), EngineBlockHash(0xffffffffffffffffULL), EngineBlockHash(3)};
  r.receiver_address = "QUJD";
  r.rkey = "REVG";
  r.block_addrs = {4096, 8192, 12288};
  r.block_bytes = 256;
  r.landing_id = 77;
  r.deadline_ms = 250;
  r.lease_id = "cmpl-p-3";
  return r;
}

TEST(PushProtocolTest, RequestRoundTripsWithFullU64Range) {
  auto back = parsePushRequest(serializePushRequest(sample()), {});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->block_hashes, sample().block_hashes);
  EXPECT_EQ(back->block_addrs, sample().block_addrs);
  EXPECT_EQ(back->landing_id, 77u);
  EXPECT_EQ(back->deadline_ms, 250);
  EXPECT_EQ(back->lease_id, "cmpl-p-3");
  EXPECT_EQ(back->receiver_url, "http://10.0.0.7:9001");
}

TEST(PushProtocolTest, RequestErrorsNameTheField) {
  auto expectError = [](const std::string& body, const std::string& field, PushLimits limits) {
    auto r = parsePushRequest(body, limits);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(std::string(r.status().message()).find(field), std::string::npos) << r.status();
  };
  std::string ok = serializePushRequest(sample());
  expectError("{}", "block_hashes", {});
  expectError("[1]", "object", {});
  PushLimits two;
  two.max_blocks = 2;
  expectError(ok, "block_hashes", two);
  PushRequest r = sample();
  r.block_addrs.pop_back();
  expectError(serializePushRequest(r), "block_addrs", {});
  r = sample();
  r.landing_id = 0;
  expectError(serializePushRequest(r), "landing_id", {});
  r = sample();
  r.deadline_ms = 0;
  expectError(serializePushRequest(r), "deadline_ms", {});
  expectError(R"({"block_hashes": [-1]})", "block_hashes[0]", {});
  PushLimits tiny;
  tiny.max_blob_bytes = 2;
  expectError(ok, "receiver_address", tiny);
  r = sample();
  r.receiver_url = "";
  expectError(serializePushRequest(r), "receiver_url", {});
  r.receiver_url = "file:///etc/passwd";
  expectError(serializePushRequest(r), "receiver_url", {});
}

TEST(PushProtocolTest, LandingClaimAndGrantRoundTripAndBound) {
  auto claim = parseLandingClaim(serializeLandingClaim({0xfedcba9876543210ULL}));
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(claim->landing_id, 0xfedcba9876543210ULL);
  EXPECT_FALSE(parseLandingClaim(R"({"landing_id": 0})").ok());
  EXPECT_FALSE(parseLandingClaim(R"({"landing_id": -4})").ok());
  EXPECT_FALSE(parseLandingClaim("{}").ok());
  LandingGrant g{9, "QUJD", "REVG", {4096, 8192}, 4096};
  auto back = parseLandingGrant(serializeLandingGrant(g), {});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->landing_id, 9u);
  EXPECT_EQ(back->transport_address, "QUJD");
  EXPECT_EQ(back->rkey, "REVG");
  EXPECT_EQ(back->block_addrs, g.block_addrs);
  EXPECT_EQ(back->block_bytes, 4096u);
  PushLimits one;
  one.max_blocks = 1;
  auto over = parseLandingGrant(serializeLandingGrant(g), one);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(std::string(over.status().message()).find("block_addrs"), std::string::npos);
  g.block_addrs.clear();
  EXPECT_FALSE(parseLandingGrant(serializeLandingGrant(g), {}).ok());
}

TEST(PushProtocolTest, ResponseAndInfoRoundTrip) {
  PushResponse r;
  r.pushed_hashes = {EngineBlockHash(5), EngineBlockHash(6)};
  r.checksums = {7, 8};
  r.missing_hashes = {EngineBlockHash(9)};
  r.pushed_bytes = 512;
  r.put_issued = true;
  r.elapsed_us = 42;
  auto back = parsePushResponse(serializePushResponse(r), {});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->pushed_hashes, r.pushed_hashes);
  EXPECT_EQ(back->missing_hashes, r.missing_hashes);
  EXPECT_EQ(back->pushed_bytes, 512u);
  EXPECT_TRUE(back->put_issued);
  EXPECT_TRUE(back->error.empty());
  // A response without put_issued is read conservatively: writes may still arrive.
  auto minimal = parsePushResponse(R"({"pushed_hashes": []})", {});
  ASSERT_TRUE(minimal.ok());
  EXPECT_TRUE(minimal->put_issued);
  EXPECT_FALSE(parsePushResponse(R"({"pushed_hashes": [1], "checksums": [1, 2]})", {}).ok());
  // An elapsed time past int64_t would turn negative when written again (found by fuzzing).
  EXPECT_FALSE(
      parsePushResponse(R"({"pushed_hashes": [], "elapsed_us": 18446744073709551615})", {}).ok());

  WorkerInfo info{"c", "QUJD", "sm", 16, 256};
  auto i = parseWorkerInfo(serializeWorkerInfo(info), {});
  ASSERT_TRUE(i.ok()) << i.status();
  EXPECT_EQ(i->block_size, 16);
  EXPECT_EQ(i->block_bytes, 256u);
  EXPECT_FALSE(parseWorkerInfo(R"({"transport_address": "x", "block_size": 0})", {}).ok());
}

}  // namespace
}  // namespace kvf::protocol
