#include "router/replica_wire.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <msgpuck.h>

#include "common/status.h"
#include "common/strings.h"

namespace kvf::router {
namespace {

constexpr std::string_view kMagic = "kvf-replica-load";
constexpr uint64_t kVersion = 1;
constexpr size_t kMacBytes = 32;

std::string hmac(std::string_view key, std::string_view message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

class Writer {
 public:
  void array(uint32_t n) {
    put(mp_sizeof_array(n), [&](char* p) { return mp_encode_array(p, n); });
  }
  void str(std::string_view s) {
    const auto n = static_cast<uint32_t>(s.size());
    put(mp_sizeof_str(n), [&](char* p) { return mp_encode_str(p, s.data(), n); });
  }
  void uint(uint64_t v) {
    put(mp_sizeof_uint(v), [&](char* p) { return mp_encode_uint(p, v); });
  }
  void integer(int64_t v) {
    if (v >= 0) return uint(static_cast<uint64_t>(v));
    put(mp_sizeof_int(v), [&](char* p) { return mp_encode_int(p, v); });
  }
  std::string take() { return std::move(out_); }

 private:
  template <typename F>
  void put(size_t n, F encode) {
    size_t at = out_.size();
    out_.resize(at + n);
    encode(out_.data() + at);
  }
  std::string out_;
};

// A cursor that checks each value's bytes before it decodes it, and never lets msgpuck walk a
// container on its own (so no announced count can make it read past the end).
class Reader {
 public:
  explicit Reader(std::string_view payload)
      : p_(payload.data()), end_(payload.data() + payload.size()) {}
  bool done() const { return p_ == end_; }

  absl::StatusOr<uint32_t> array(std::string_view what, size_t limit) {
    if (!is(MP_ARRAY) || mp_check_array(p_, end_) > 0) return bad(what, "not an array");
    uint32_t n = mp_decode_array(&p_);
    // Each item takes at least one byte.
    if (n > limit || n > static_cast<size_t>(end_ - p_)) {
      return bad(what, strCat(n, " items exceed ", limit));
    }
    return n;
  }
  absl::StatusOr<std::string_view> str(std::string_view what, size_t limit) {
    if (!is(MP_STR) || mp_check_strl(p_, end_) > 0) return bad(what, "not a string");
    uint32_t len = mp_decode_strl(&p_);
    if (len > limit || len > static_cast<size_t>(end_ - p_)) return bad(what, "too long");
    std::string_view s(p_, len);
    p_ += len;
    return s;
  }
  absl::StatusOr<uint64_t> uint(std::string_view what) {
    if (!is(MP_UINT) || mp_check_uint(p_, end_) > 0) return bad(what, "not an unsigned integer");
    return mp_decode_uint(&p_);
  }
  absl::StatusOr<int64_t> integer(std::string_view what) {
    if (is(MP_INT)) {
      if (mp_check_int(p_, end_) > 0) return bad(what, "truncated");
      return mp_decode_int(&p_);
    }
    KVF_ASSIGN_OR_RETURN(uint64_t v, uint(what));
    if (v > static_cast<uint64_t>(INT64_MAX)) return bad(what, "too large");
    return static_cast<int64_t>(v);
  }

 private:
  bool is(mp_type type) const { return p_ < end_ && mp_typeof(*p_) == type; }
  static absl::Status bad(std::string_view what, std::string_view why) {
    return absl::InvalidArgumentError(strCat("replica message ", what, ": ", why));
  }
  const char* p_;
  const char* end_;
};

}  // namespace

std::string replicaLoadKey(std::string_view worker_token) {
  if (worker_token.empty()) return {};
  return hmac(worker_token, "kvfabric replica load v1");
}

std::string encodeReplicaMessage(const ReplicaMessage& m) {
  Writer w;
  w.array(8);
  w.str(kMagic);
  w.uint(kVersion);
  w.uint(static_cast<uint64_t>(m.kind));
  w.str(m.replica);
  w.uint(m.epoch);
  w.uint(m.seq);
  w.integer(m.sent_unix_ns);
  w.array(static_cast<uint32_t>(m.entries.size()));
  for (const ReplicaLoadEntry& e : m.entries) {
    w.array(4);
    w.str(e.instance);
    w.integer(e.load.running);
    w.integer(e.load.pending_prefill_tokens);
    w.integer(e.load.ongoing_tokens);
  }
  return w.take();
}

std::string signReplicaPayload(std::string_view key, std::string_view payload) {
  return hmac(key, payload);
}

absl::StatusOr<ReplicaMessage> decodeReplicaMessage(std::string_view key, std::string_view payload,
                                                    std::string_view mac,
                                                    const ReplicaWireLimits& limits) {
  const std::string expected = hmac(key, payload);
  if (key.empty() || mac.size() != kMacBytes ||
      CRYPTO_memcmp(expected.data(), mac.data(), kMacBytes) != 0) {
    return absl::PermissionDeniedError("replica message: bad signature");
  }
  Reader r(payload);
  KVF_ASSIGN_OR_RETURN(uint32_t fields, r.array("", 8));
  if (fields != 8) return absl::InvalidArgumentError("replica message: expected 8 fields");
  KVF_ASSIGN_OR_RETURN(std::string_view magic, r.str("magic", kMagic.size()));
  if (magic != kMagic) return absl::InvalidArgumentError("replica message: wrong magic");
  KVF_ASSIGN_OR_RETURN(uint64_t version, r.uint("version"));
  if (version != kVersion) {
    return absl::InvalidArgumentError(strCat("replica message: version ", version, " unknown"));
  }
  ReplicaMessage m;
  KVF_ASSIGN_OR_RETURN(uint64_t kind, r.uint("kind"));
  if (kind > 1) return absl::InvalidArgumentError("replica message kind: must be 0 or 1");
  m.kind = static_cast<ReplicaMessage::Kind>(kind);
  KVF_ASSIGN_OR_RETURN(std::string_view replica, r.str("replica", limits.max_id_bytes));
  if (replica.empty()) return absl::InvalidArgumentError("replica message replica: empty");
  m.replica = std::string(replica);
  KVF_ASSIGN_OR_RETURN(m.epoch, r.uint("epoch"));
  KVF_ASSIGN_OR_RETURN(m.seq, r.uint("seq"));
  KVF_ASSIGN_OR_RETURN(m.sent_unix_ns, r.integer("sent_unix_ns"));
  KVF_ASSIGN_OR_RETURN(uint32_t n, r.array("entries", limits.max_entries));
  m.entries.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    KVF_ASSIGN_OR_RETURN(uint32_t width, r.array("entry", 4));
    if (width != 4) return absl::InvalidArgumentError("replica message entry: expected 4 fields");
    ReplicaLoadEntry e;
    KVF_ASSIGN_OR_RETURN(std::string_view instance, r.str("instance", limits.max_id_bytes));
    e.instance = std::string(instance);
    KVF_ASSIGN_OR_RETURN(e.load.running, r.integer("running"));
    KVF_ASSIGN_OR_RETURN(e.load.pending_prefill_tokens, r.integer("pending_prefill_tokens"));
    KVF_ASSIGN_OR_RETURN(e.load.ongoing_tokens, r.integer("ongoing_tokens"));
    m.entries.push_back(std::move(e));
  }
  if (!r.done()) return absl::InvalidArgumentError("replica message: trailing bytes");
  return m;
}

}  // namespace kvf::router
