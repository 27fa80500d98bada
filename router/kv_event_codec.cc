#include "router/kv_event_codec.h"

#include <msgpuck.h>

#include "common/status.h"
#include "common/strings.h"
#include "policy/block_hash.h"

namespace kvf::router {
namespace {

using absl::InvalidArgumentError;

// Whether `payload` is exactly one well-formed msgpack value. msgpuck's mp_check counts the
// values still to read in an int: an array header of 2^31 or more entries (a map of 2^30) wraps
// it negative and mp_check accepts the payload unread, so a 5-byte map header announcing a
// billion entries passed and the reader ran off the buffer. Here the count is 64-bit and an
// array or map may not announce more entries than bytes remain (each takes at least one).
bool wellFormedMsgpack(std::string_view payload) {
  const char* p = payload.data();
  const char* end = p + payload.size();
  uint64_t pending = 1;
  while (pending > 0) {
    if (p >= end) return false;
    --pending;
    mp_type type = mp_typeof(*p);
    if (type == MP_ARRAY) {
      if (mp_check_array(p, end) > 0) return false;
      pending += mp_decode_array(&p);
    } else if (type == MP_MAP) {
      if (mp_check_map(p, end) > 0) return false;
      pending += uint64_t{2} * mp_decode_map(&p);
    } else if (mp_check(&p, end) != 0) {  // a scalar: mp_check reads exactly one
      return false;
    }
    if (pending > static_cast<uint64_t>(end - p)) return false;
  }
  return p == end;
}

// A cursor over a payload already validated by wellFormedMsgpack, so reads cannot overrun;
// type checks remain ours.
struct Reader {
  const char* p;

  mp_type type() const { return mp_typeof(*p); }
  bool isNil() const { return type() == MP_NIL; }
  void skip() { mp_next(&p); }

  absl::StatusOr<std::string_view> str(std::string_view what) {
    if (type() != MP_STR && type() != MP_BIN)
      return InvalidArgumentError(strCat(what, ": not a string"));
    uint32_t len = 0;
    const char* s = mp_decode_strbin(&p, &len);
    return std::string_view(s, len);
  }
  absl::StatusOr<int64_t> integer(std::string_view what) {
    if (type() == MP_UINT) {
      uint64_t v = mp_decode_uint(&p);
      if (v > static_cast<uint64_t>(INT64_MAX))
        return InvalidArgumentError(strCat(what, ": too large"));
      return static_cast<int64_t>(v);
    }
    if (type() == MP_INT) return mp_decode_int(&p);
    return InvalidArgumentError(strCat(what, ": not an integer"));
  }
  absl::StatusOr<double> number(std::string_view what) {
    if (type() == MP_DOUBLE) return mp_decode_double(&p);
    if (type() == MP_FLOAT) return static_cast<double>(mp_decode_float(&p));
    auto i = integer(what);
    if (!i.ok()) return i.status();
    return static_cast<double>(*i);
  }
  // An engine block hash: unsigned or signed integer (bit pattern kept) or bytes (reduced).
  absl::StatusOr<uint64_t> hash(std::string_view what) {
    switch (type()) {
      case MP_UINT:
        return mp_decode_uint(&p);
      case MP_INT:
        return static_cast<uint64_t>(mp_decode_int(&p));
      case MP_BIN:
      case MP_STR: {
        uint32_t len = 0;
        const char* s = mp_decode_strbin(&p, &len);
        return policy::engineHashFromBytes(std::string_view(s, len));
      }
      default:
        return InvalidArgumentError(strCat(what, ": not an integer or bytes"));
    }
  }
  absl::StatusOr<uint32_t> array(std::string_view what, size_t limit) {
    if (type() != MP_ARRAY) return InvalidArgumentError(strCat(what, ": not an array"));
    uint32_t n = mp_decode_array(&p);
    if (n > limit) return InvalidArgumentError(strCat(what, ": ", n, " items exceed ", limit));
    return n;
  }
};

absl::Status readHashes(Reader& r, std::string_view what, size_t limit,
                        std::vector<uint64_t>* out) {
  KVF_ASSIGN_OR_RETURN(uint32_t n, r.array(what, limit));
  out->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    KVF_ASSIGN_OR_RETURN(uint64_t h, r.hash(what));
    out->push_back(h);
  }
  return absl::OkStatus();
}

absl::Status readParent(Reader& r, policy::StoredBlocks* out) {
  if (r.isNil()) {
    r.skip();
    return absl::OkStatus();
  }
  KVF_ASSIGN_OR_RETURN(out->engine_parent, r.hash("parent_block_hash"));
  out->has_parent = true;
  return absl::OkStatus();
}

absl::Status readTokens(Reader& r, size_t limit, std::vector<policy::TokenId>* out) {
  KVF_ASSIGN_OR_RETURN(uint32_t n, r.array("token_ids", limit));
  out->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    KVF_ASSIGN_OR_RETURN(int64_t t, r.integer("token_ids"));
    if (t < 0 || t > UINT32_MAX) return InvalidArgumentError("token_ids: out of range");
    out->push_back(static_cast<policy::TokenId>(t));
  }
  return absl::OkStatus();
}

absl::Status readBlockSize(Reader& r, policy::StoredBlocks* out) {
  KVF_ASSIGN_OR_RETURN(int64_t bs, r.integer("block_size"));
  if (bs <= 0 || bs > 1 << 20) return InvalidArgumentError("block_size: out of range");
  out->block_size = static_cast<size_t>(bs);
  return absl::OkStatus();
}

absl::Status readMedium(Reader& r, std::string* out) {
  if (r.isNil()) {
    r.skip();
    return absl::OkStatus();
  }
  KVF_ASSIGN_OR_RETURN(std::string_view m, r.str("medium"));
  *out = std::string(m.substr(0, 64));
  return absl::OkStatus();
}

absl::StatusOr<KvEventKind> kindFromTag(std::string_view tag) {
  if (tag == "BlockStored") return KvEventKind::kBlockStored;
  if (tag == "BlockRemoved") return KvEventKind::kBlockRemoved;
  if (tag == "AllBlocksCleared") return KvEventKind::kAllBlocksCleared;
  return InvalidArgumentError(strCat("unknown event type \"", tag.substr(0, 64), "\""));
}

// ["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, ...]
absl::Status readArrayEvent(Reader& r, uint32_t n, const KvEventLimits& limits, KvEvent* e) {
  KVF_ASSIGN_OR_RETURN(std::string_view tag, r.str("event tag"));
  KVF_ASSIGN_OR_RETURN(e->kind, kindFromTag(tag));
  uint32_t field = 1;
  if (e->kind == KvEventKind::kBlockStored) {
    if (n < 5) return InvalidArgumentError("BlockStored: fewer than 4 fields");
    KVF_RETURN_IF_ERROR(readHashes(r, "block_hashes", limits.max_hashes, &e->stored.engine_hashes));
    KVF_RETURN_IF_ERROR(readParent(r, &e->stored));
    KVF_RETURN_IF_ERROR(readTokens(r, limits.max_tokens, &e->stored.token_ids));
    KVF_RETURN_IF_ERROR(readBlockSize(r, &e->stored));
    field = 5;
    if (n > 5) r.skip(), ++field;  // lora_id
    if (n > 6) {
      KVF_RETURN_IF_ERROR(readMedium(r, &e->medium));
      ++field;
    }
  } else if (e->kind == KvEventKind::kBlockRemoved) {
    if (n < 2) return InvalidArgumentError("BlockRemoved: no block_hashes");
    KVF_RETURN_IF_ERROR(readHashes(r, "block_hashes", limits.max_hashes, &e->removed));
    field = 2;
    if (n > 2) {
      KVF_RETURN_IF_ERROR(readMedium(r, &e->medium));
      ++field;
    }
  }
  for (; field < n; ++field) r.skip();  // fields added by newer engines
  return absl::OkStatus();
}

absl::Status readMapEvent(Reader& r, uint32_t n, const KvEventLimits& limits, KvEvent* e) {
  bool has_type = false;
  for (uint32_t i = 0; i < n; ++i) {
    KVF_ASSIGN_OR_RETURN(std::string_view key, r.str("event key"));
    if (key == "type") {
      KVF_ASSIGN_OR_RETURN(std::string_view tag, r.str("type"));
      KVF_ASSIGN_OR_RETURN(e->kind, kindFromTag(tag));
      has_type = true;
    } else if (key == "block_hashes") {
      // Stored and removed share the field; sorted out once the type is known.
      KVF_RETURN_IF_ERROR(readHashes(r, "block_hashes", limits.max_hashes, &e->removed));
    } else if (key == "parent_block_hash") {
      KVF_RETURN_IF_ERROR(readParent(r, &e->stored));
    } else if (key == "token_ids") {
      KVF_RETURN_IF_ERROR(readTokens(r, limits.max_tokens, &e->stored.token_ids));
    } else if (key == "block_size") {
      KVF_RETURN_IF_ERROR(readBlockSize(r, &e->stored));
    } else if (key == "medium") {
      KVF_RETURN_IF_ERROR(readMedium(r, &e->medium));
    } else {
      r.skip();
    }
  }
  if (!has_type) return InvalidArgumentError("event map without \"type\"");
  if (e->kind == KvEventKind::kBlockStored) {
    e->stored.engine_hashes = std::move(e->removed);
    e->removed.clear();
    if (e->stored.block_size == 0) return InvalidArgumentError("BlockStored: no block_size");
  }
  return absl::OkStatus();
}

absl::Status readEvent(Reader& r, const KvEventLimits& limits, KvEvent* e) {
  if (r.type() == MP_ARRAY) {
    uint32_t n = mp_decode_array(&r.p);
    if (n == 0) return InvalidArgumentError("empty event");
    return readArrayEvent(r, n, limits, e);
  }
  if (r.type() == MP_MAP) {
    uint32_t n = mp_decode_map(&r.p);
    return readMapEvent(r, n, limits, e);
  }
  return InvalidArgumentError("event is neither an array nor a map");
}

absl::Status readEvents(Reader& r, const KvEventLimits& limits, KvEventBatch* batch) {
  KVF_ASSIGN_OR_RETURN(uint32_t n, r.array("events", limits.max_events));
  batch->events.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    absl::Status s = readEvent(r, limits, &batch->events[i]);
    if (!s.ok()) return annotate(s, strCat("event ", i));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvEventBatch> decodeKvEventBatch(std::string_view payload,
                                                const KvEventLimits& limits) {
  if (!wellFormedMsgpack(payload)) {
    return InvalidArgumentError("KV event batch is not one well-formed msgpack value");
  }
  Reader r{payload.data()};
  KvEventBatch batch;
  if (r.type() == MP_ARRAY) {
    uint32_t n = mp_decode_array(&r.p);
    if (n < 2) return InvalidArgumentError("KV event batch: fewer than 2 fields");
    KVF_ASSIGN_OR_RETURN(batch.ts, r.number("ts"));
    KVF_RETURN_IF_ERROR(readEvents(r, limits, &batch));
    if (n > 2 && !r.isNil()) {
      KVF_ASSIGN_OR_RETURN(int64_t rank, r.integer("data_parallel_rank"));
      batch.data_parallel_rank = rank;
    }
    return batch;
  }
  if (r.type() != MP_MAP) return InvalidArgumentError("KV event batch is neither array nor map");
  uint32_t n = mp_decode_map(&r.p);
  bool has_events = false;
  for (uint32_t i = 0; i < n; ++i) {
    KVF_ASSIGN_OR_RETURN(std::string_view key, r.str("batch key"));
    if (key == "ts") {
      KVF_ASSIGN_OR_RETURN(batch.ts, r.number("ts"));
    } else if (key == "events") {
      KVF_RETURN_IF_ERROR(readEvents(r, limits, &batch));
      has_events = true;
    } else if (key == "data_parallel_rank" && !r.isNil()) {
      KVF_ASSIGN_OR_RETURN(int64_t rank, r.integer("data_parallel_rank"));
      batch.data_parallel_rank = rank;
    } else {
      r.skip();
    }
  }
  if (!has_events) return InvalidArgumentError("KV event batch map without \"events\"");
  return batch;
}

}  // namespace kvf::router
