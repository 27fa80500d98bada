// Signed kv_transfer_params: a signature verifies once, for the params, request id and time it
// was made for, under the key it was made with; anything else is refused with a reason.
#include "protocol/transfer_auth.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

namespace kvf::protocol {
namespace {

constexpr int64_t kNow = 1'800'000'000'000;

KvTransferParams params() {
  KvTransferParams p;
  p.source = "http://127.0.0.1:9001";
  p.block_hashes = std::vector<EngineBlockHash>{EngineBlockHash(7), EngineBlockHash(~0ull)};
  p.lease_id = "lease-1";
  return p;
}

// The engine's own copy of the params: parsed from the body the router serialized.
boost::json::value wire(const KvTransferParams& p) {
  return boost::json::parse(boost::json::serialize(kvTransferParamsJson(p)));
}

TEST(TransferAuthTest, SignatureVerifiesOnceAndOnlyForWhatWasSigned) {
  const std::string key = transferAuthKey("cluster-token");
  TransferAuthVerifier v(key, {});
  const std::string nonce = randomNonce();
  ASSERT_EQ(nonce.size(), 32u);
  std::string h = signKvTransfer(key, wire(params()), "req-1", kNow, nonce);
  EXPECT_TRUE(v.verify(h, wire(params()), "req-1", kNow + 5).ok());
  // The same header again: a replay.
  absl::Status again = v.verify(h, wire(params()), "req-1", kNow + 6);
  EXPECT_TRUE(absl::IsPermissionDenied(again));
  EXPECT_NE(again.message().find("replayed"), std::string_view::npos) << again;

  auto fresh = [&](const KvTransferParams& p, std::string_view id) {
    return signKvTransfer(key, p, id, kNow, randomNonce());
  };
  KvTransferParams other = params();
  other.source = "http://evil.example:80";
  // Signed for other params, another request id, or under another key: refused.
  EXPECT_TRUE(
      absl::IsPermissionDenied(v.verify(fresh(params(), "req-2"), wire(other), "req-2", kNow)));
  EXPECT_TRUE(
      absl::IsPermissionDenied(v.verify(fresh(params(), "req-3"), wire(params()), "x", kNow)));
  std::string foreign =
      signKvTransfer(transferAuthKey("other-token"), wire(params()), "req-4", kNow, randomNonce());
  EXPECT_TRUE(absl::IsPermissionDenied(v.verify(foreign, wire(params()), "req-4", kNow)));
  KvTransferParams longer = params();
  longer.lease_ms = 600'000;
  EXPECT_TRUE(
      absl::IsPermissionDenied(v.verify(fresh(params(), "req-5"), wire(longer), "req-5", kNow)));
}

// Members an engine does not act on today (a connector's remote_* fields) are covered too.
TEST(TransferAuthTest, EveryMemberOfTheObjectIsCovered) {
  const std::string key = transferAuthKey("cluster-token");
  TransferAuthVerifier v(key, {});
  auto signed_params = boost::json::parse(R"({"source":"http://a:1","remote_host":"10.0.0.1"})");
  auto tampered = boost::json::parse(R"({"source":"http://a:1","remote_host":"10.6.6.6"})");
  std::string h = signKvTransfer(key, signed_params, "r", kNow, randomNonce());
  EXPECT_TRUE(absl::IsPermissionDenied(v.verify(h, tampered, "r", kNow)));
  EXPECT_TRUE(
      v.verify(h, boost::json::parse(boost::json::serialize(signed_params)), "r", kNow).ok());
}

TEST(TransferAuthTest, StaleFutureAndMalformedHeadersAreRefused) {
  const std::string key = transferAuthKey("cluster-token");
  TransferAuthOptions o;
  o.freshness_ms = 1000;
  TransferAuthVerifier v(key, o);
  auto at = [&](int64_t t) { return signKvTransfer(key, wire(params()), "r", t, randomNonce()); };
  EXPECT_TRUE(absl::IsPermissionDenied(v.verify(at(kNow - 1001), wire(params()), "r", kNow)));
  EXPECT_TRUE(absl::IsPermissionDenied(v.verify(at(kNow + 1001), wire(params()), "r", kNow)));
  EXPECT_TRUE(v.verify(at(kNow - 1000), wire(params()), "r", kNow).ok());
  std::string good = at(kNow);
  for (std::string bad :
       {std::string(), std::string("v1"), "v2" + good.substr(2), good + " ", " " + good,
        good.substr(0, good.size() - 1) + "G", good.substr(0, good.size() - 1)}) {
    EXPECT_TRUE(absl::IsPermissionDenied(v.verify(bad, wire(params()), "r", kNow))) << bad;
  }
  EXPECT_TRUE(v.verify(good, wire(params()), "r", kNow).ok());
}

TEST(TransferAuthTest, NonceMemoryIsBounded) {
  const std::string key = transferAuthKey("t");
  TransferAuthOptions o;
  o.freshness_ms = 1000;
  o.max_remembered_nonces = 2;
  TransferAuthVerifier v(key, o);
  auto at = [&](int64_t t) { return signKvTransfer(key, wire(params()), "r", t, randomNonce()); };
  EXPECT_TRUE(v.verify(at(kNow), wire(params()), "r", kNow).ok());
  EXPECT_TRUE(v.verify(at(kNow), wire(params()), "r", kNow).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(v.verify(at(kNow), wire(params()), "r", kNow)));
  // Once the window has passed, the old nonces are forgotten (they could not verify anyway).
  EXPECT_TRUE(v.verify(at(kNow + 1500), wire(params()), "r", kNow + 1500).ok());
}

// The MAC is HMAC-SHA256 as specified (RFC 2104): checked against Python's hmac module on the
// documented signing input, not against our own code.
TEST(TransferAuthTest, MacMatchesAnIndependentHmacSha256) {
  // python3 -c 'import hmac,hashlib; k=hmac.new(b"cluster-token",
  //   b"kvfabric kv_transfer_params signing key v1", hashlib.sha256).digest();
  //   print(hmac.new(k, b"kvf-kv-transfer-v1\n5:req-1\n1800000000000\n" + b"0"*32 +
  //   b"\n{\"source\":\"http://127.0.0.1:9001\",\"block_hashes\":[7,18446744073709551615],"
  //   b"\"lease_id\":\"lease-1\"}", hashlib.sha256).hexdigest())'
  const std::string expected = "f543ccbfe30df43a820656e5811133a5d3382444e32c77a9a2a72a5084a80e75";
  std::string h = signKvTransfer(transferAuthKey("cluster-token"), wire(params()), "req-1", kNow,
                                 std::string(32, '0'));
  EXPECT_EQ(h, "v1 1800000000000 " + std::string(32, '0') + " " + expected);
}

}  // namespace
}  // namespace kvf::protocol
