#include "protocol/transfer_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <charconv>

#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "common/strings.h"

namespace kvf::protocol {
namespace {

constexpr std::string_view kVersion = "v1";
constexpr std::string_view kKeyLabel = "kvfabric kv_transfer_params signing key v1";
constexpr size_t kNonceHexChars = 32;
constexpr size_t kMacHexChars = 64;

std::string hex(const unsigned char* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 15];
  }
  return out;
}

bool isLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::array<unsigned char, 32> hmacSha256(std::string_view key, std::string_view message) {
  std::array<unsigned char, 32> mac{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac.data(), &len);
  return mac;
}

// What the MAC covers: the params object as serialized (Boost.JSON's output is the same after a
// parse and serialize round trip, so both ends compute it from their own copy), the request id,
// the time and the nonce. Fields are newline-separated; the request id is length-prefixed and
// the rest cannot contain a newline (compact JSON, digits, hex).
std::string signingInput(const boost::json::value& params, std::string_view request_id,
                         int64_t unix_ms, std::string_view nonce) {
  return strCat("kvf-kv-transfer-", kVersion, "\n", request_id.size(), ":", request_id, "\n",
                unix_ms, "\n", nonce, "\n", boost::json::serialize(params));
}

absl::Status denied(std::string_view why) {
  return absl::PermissionDeniedError(
      strCat(kKvTransferParamsKey, ": not accepted from this sender (", kTransferAuthHeader, ": ",
             why, "); only the router may send them"));
}

}  // namespace

std::string transferAuthKey(std::string_view worker_token) {
  if (worker_token.empty()) return {};
  auto mac = hmacSha256(worker_token, kKeyLabel);
  return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
}

std::string randomNonce() {
  std::array<unsigned char, kNonceHexChars / 2> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    // Only when the CSPRNG cannot seed: a repeated nonce is refused by the engine, never
    // accepted twice, so failing closed here costs the transfer, not safety.
    return std::string(kNonceHexChars, '0');
  }
  return hex(bytes.data(), bytes.size());
}

std::string signKvTransfer(std::string_view key, const KvTransferParams& params,
                           std::string_view request_id, int64_t unix_ms, std::string_view nonce) {
  return signKvTransfer(key, boost::json::value(kvTransferParamsJson(params)), request_id, unix_ms,
                        nonce);
}

std::string signKvTransfer(std::string_view key, const boost::json::value& params,
                           std::string_view request_id, int64_t unix_ms, std::string_view nonce) {
  auto mac = hmacSha256(key, signingInput(params, request_id, unix_ms, nonce));
  return strCat(kVersion, " ", unix_ms, " ", nonce, " ", hex(mac.data(), mac.size()));
}

TransferAuthVerifier::TransferAuthVerifier(std::string key, TransferAuthOptions options)
    : key_(std::move(key)), options_(options) {}

void TransferAuthVerifier::forgetExpired(int64_t now_unix_ms) {
  while (!by_time_.empty() && by_time_.front().first < now_unix_ms - options_.freshness_ms) {
    seen_.erase(by_time_.front().second);
    by_time_.pop_front();
  }
}

absl::Status TransferAuthVerifier::verify(std::string_view header, const boost::json::value& params,
                                          std::string_view request_id, int64_t now_unix_ms) {
  if (header.empty()) return denied("missing");
  // "v1 <unix_ms> <nonce> <mac>"
  std::string_view parts[4];
  size_t n = 0;
  for (size_t start = 0; start <= header.size() && n < 4;) {
    size_t end = header.find(' ', start);
    if (end == std::string_view::npos) end = header.size();
    parts[n++] = header.substr(start, end - start);
    start = end + 1;
  }
  if (n != 4 || parts[0] != kVersion || parts[2].size() != kNonceHexChars ||
      parts[3].size() != kMacHexChars || !isLowerHex(parts[2]) || !isLowerHex(parts[3]) ||
      parts[0].size() + parts[1].size() + parts[2].size() + parts[3].size() + 3 != header.size()) {
    return denied("malformed");
  }
  int64_t signed_ms = 0;
  auto [end, ec] = std::from_chars(parts[1].data(), parts[1].data() + parts[1].size(), signed_ms);
  if (ec != std::errc() || end != parts[1].data() + parts[1].size() || signed_ms < 0) {
    return denied("malformed time");
  }
  auto expected = hmacSha256(key_, signingInput(params, request_id, signed_ms, parts[2]));
  std::string expected_hex = hex(expected.data(), expected.size());
  if (CRYPTO_memcmp(expected_hex.data(), parts[3].data(), kMacHexChars) != 0) {
    return denied("bad signature");
  }
  // Checked after the MAC so that an unauthenticated sender learns nothing about our clock.
  if (signed_ms < now_unix_ms - options_.freshness_ms ||
      signed_ms > now_unix_ms + options_.freshness_ms) {
    return denied(strCat("signed ", signed_ms - now_unix_ms, " ms from now, outside the ",
                         options_.freshness_ms, " ms window"));
  }
  forgetExpired(now_unix_ms);
  std::string nonce(parts[2]);
  if (seen_.contains(nonce)) return denied("replayed");
  if (seen_.size() >= options_.max_remembered_nonces) {
    return absl::ResourceExhaustedError("kv_transfer_params: too many signed requests in flight");
  }
  seen_.insert(nonce);
  // Kept in arrival order; signed times are within the window of one another, so expiry by
  // the front is at most one window late.
  by_time_.emplace_back(signed_ms, std::move(nonce));
  return absl::OkStatus();
}

}  // namespace kvf::protocol
