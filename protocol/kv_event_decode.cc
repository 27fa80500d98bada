// decodeEventBatch (protocol/kv_events.h): both layouts vLLM has written, every field of its
// current events, bounded counts.
#include <msgpuck.h>

#include "common/status.h"
#include "common/strings.h"
#include "protocol/kv_events.h"

namespace kvf::protocol {
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

// A cursor over a payload already validated by wellFormedMsgpack, so reads cannot overrun; type
// checks remain ours.
struct Reader {
  const char* p;
  const KvEventLimits& limits;

  mp_type type() const { return mp_typeof(*p); }
  bool isNil() const { return type() == MP_NIL; }
  void skip() { mp_next(&p); }
  // True (and consumed) when the next value is nil.
  bool takeNil() {
    if (!isNil()) return false;
    mp_decode_nil(&p);
    return true;
  }

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
    KVF_ASSIGN_OR_RETURN(int64_t i, integer(what));
    return static_cast<double>(i);
  }
  // An engine block hash: unsigned or signed integer (bit pattern kept) or bytes (reduced).
  absl::StatusOr<EngineBlockHash> hash(std::string_view what) {
    switch (type()) {
      case MP_UINT:
        return EngineBlockHash(mp_decode_uint(&p));
      case MP_INT:
        return EngineBlockHash(static_cast<uint64_t>(mp_decode_int(&p)));
      case MP_BIN:
      case MP_STR: {
        uint32_t len = 0;
        const char* s = mp_decode_strbin(&p, &len);
        return engineHashFromBytes(std::string_view(s, len));
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

  absl::Status hashes(std::string_view what, std::vector<EngineBlockHash>* out) {
    KVF_ASSIGN_OR_RETURN(uint32_t n, array(what, limits.max_hashes));
    out->reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      KVF_ASSIGN_OR_RETURN(EngineBlockHash h, hash(what));
      out->push_back(h);
    }
    return absl::OkStatus();
  }
  absl::Status optionalHash(std::string_view what, std::optional<EngineBlockHash>* out) {
    if (takeNil()) return absl::OkStatus();
    KVF_ASSIGN_OR_RETURN(*out, hash(what));
    return absl::OkStatus();
  }
  absl::Status tokens(std::vector<TokenId>* out) {
    KVF_ASSIGN_OR_RETURN(uint32_t n, array("token_ids", limits.max_tokens));
    out->reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      KVF_ASSIGN_OR_RETURN(int64_t t, integer("token_ids"));
      std::optional<TokenId> id = tokenIdFromWire(t);
      if (!id) return InvalidArgumentError(strCat("token_ids[", i, "]: ", t, " is out of range"));
      out->push_back(*id);
    }
    return absl::OkStatus();
  }
  absl::Status blockSize(int64_t* out) {
    KVF_ASSIGN_OR_RETURN(int64_t bs, integer("block_size"));
    if (bs <= 0 || bs > 1 << 20) return InvalidArgumentError("block_size: out of range");
    *out = bs;
    return absl::OkStatus();
  }
  absl::Status optionalInt(std::string_view what, std::optional<int64_t>* out) {
    if (takeNil()) return absl::OkStatus();
    KVF_ASSIGN_OR_RETURN(*out, integer(what));
    return absl::OkStatus();
  }
  // Strings are cut to max_string_bytes (a name, a tier: nothing longer is meaningful).
  absl::Status optionalStr(std::string_view what, std::optional<std::string>* out) {
    if (takeNil()) return absl::OkStatus();
    KVF_ASSIGN_OR_RETURN(std::string_view s, str(what));
    *out = std::string(s.substr(0, limits.max_string_bytes));
    return absl::OkStatus();
  }
  // A list with one entry per block, each a tuple (kept as its msgpack bytes) or nil.
  absl::Status extraKeys(std::optional<std::vector<std::optional<std::string>>>* out) {
    if (takeNil()) return absl::OkStatus();
    KVF_ASSIGN_OR_RETURN(uint32_t n, array("extra_keys", limits.max_hashes));
    out->emplace().reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      if (takeNil()) {
        (*out)->emplace_back();
        continue;
      }
      const char* begin = p;
      skip();
      if (static_cast<size_t>(p - begin) > limits.max_extra_key_bytes) {
        return InvalidArgumentError(
            strCat("extra_keys[", i, "]: longer than ", limits.max_extra_key_bytes, " bytes"));
      }
      (*out)->emplace_back(std::string(begin, p));
    }
    return absl::OkStatus();
  }
};

enum class Kind { kStored, kRemoved, kCleared };

absl::StatusOr<Kind> kindFromTag(std::string_view tag) {
  if (tag == "BlockStored") return Kind::kStored;
  if (tag == "BlockRemoved") return Kind::kRemoved;
  if (tag == "AllBlocksCleared") return Kind::kCleared;
  return InvalidArgumentError(strCat("unknown event type \"", tag.substr(0, 64), "\""));
}

// ["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, lora_name,
//  extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, ...]
absl::StatusOr<BlockStored> readStoredArray(Reader& r, uint32_t n) {
  if (n < 5) return InvalidArgumentError("BlockStored: fewer than 4 fields");
  BlockStored e;
  e.medium.reset();
  KVF_RETURN_IF_ERROR(r.hashes("block_hashes", &e.block_hashes));
  KVF_RETURN_IF_ERROR(r.optionalHash("parent_block_hash", &e.parent_block_hash));
  KVF_RETURN_IF_ERROR(r.tokens(&e.token_ids));
  KVF_RETURN_IF_ERROR(r.blockSize(&e.block_size));
  uint32_t field = 5;
  auto next = [&]() { return field < n ? (++field, true) : false; };
  if (next()) KVF_RETURN_IF_ERROR(r.optionalInt("lora_id", &e.lora_id));
  if (next()) KVF_RETURN_IF_ERROR(r.optionalStr("medium", &e.medium));
  if (next()) KVF_RETURN_IF_ERROR(r.optionalStr("lora_name", &e.lora_name));
  if (next()) KVF_RETURN_IF_ERROR(r.extraKeys(&e.extra_keys));
  if (next()) KVF_RETURN_IF_ERROR(r.optionalInt("group_idx", &e.group_idx));
  if (next()) KVF_RETURN_IF_ERROR(r.optionalStr("kv_cache_spec_kind", &e.kv_cache_spec_kind));
  if (next()) {
    KVF_RETURN_IF_ERROR(
        r.optionalInt("kv_cache_spec_sliding_window", &e.kv_cache_spec_sliding_window));
  }
  for (; field < n; ++field) r.skip();  // fields added by newer engines
  return e;
}

// ["BlockRemoved", hashes, medium, group_idx, ...]
absl::StatusOr<BlockRemoved> readRemovedArray(Reader& r, uint32_t n) {
  if (n < 2) return InvalidArgumentError("BlockRemoved: no block_hashes");
  BlockRemoved e;
  e.medium.reset();
  KVF_RETURN_IF_ERROR(r.hashes("block_hashes", &e.block_hashes));
  uint32_t field = 2;
  auto next = [&]() { return field < n ? (++field, true) : false; };
  if (next()) KVF_RETURN_IF_ERROR(r.optionalStr("medium", &e.medium));
  if (next()) KVF_RETURN_IF_ERROR(r.optionalInt("group_idx", &e.group_idx));
  for (; field < n; ++field) r.skip();
  return e;
}

absl::StatusOr<KvEvent> readArrayEvent(Reader& r, uint32_t n) {
  KVF_ASSIGN_OR_RETURN(std::string_view tag, r.str("event tag"));
  KVF_ASSIGN_OR_RETURN(Kind kind, kindFromTag(tag));
  if (kind == Kind::kStored) return readStoredArray(r, n);
  if (kind == Kind::kRemoved) return readRemovedArray(r, n);
  for (uint32_t field = 1; field < n; ++field) r.skip();
  return AllBlocksCleared{};
}

// {"type": tag, field: value, ...} in any order. The fields of both event types are read into
// a BlockStored, then moved to the event the type names.
absl::StatusOr<KvEvent> readMapEvent(Reader& r, uint32_t n) {
  std::optional<Kind> kind;
  BlockStored e;
  e.medium.reset();
  bool has_block_size = false;
  for (uint32_t i = 0; i < n; ++i) {
    KVF_ASSIGN_OR_RETURN(std::string_view key, r.str("event key"));
    if (key == "type") {
      KVF_ASSIGN_OR_RETURN(std::string_view tag, r.str("type"));
      KVF_ASSIGN_OR_RETURN(kind, kindFromTag(tag));
    } else if (key == "block_hashes") {
      KVF_RETURN_IF_ERROR(r.hashes("block_hashes", &e.block_hashes));
    } else if (key == "parent_block_hash") {
      KVF_RETURN_IF_ERROR(r.optionalHash("parent_block_hash", &e.parent_block_hash));
    } else if (key == "token_ids") {
      KVF_RETURN_IF_ERROR(r.tokens(&e.token_ids));
    } else if (key == "block_size") {
      KVF_RETURN_IF_ERROR(r.blockSize(&e.block_size));
      has_block_size = true;
    } else if (key == "lora_id") {
      KVF_RETURN_IF_ERROR(r.optionalInt("lora_id", &e.lora_id));
    } else if (key == "medium") {
      KVF_RETURN_IF_ERROR(r.optionalStr("medium", &e.medium));
    } else if (key == "lora_name") {
      KVF_RETURN_IF_ERROR(r.optionalStr("lora_name", &e.lora_name));
    } else if (key == "extra_keys") {
      KVF_RETURN_IF_ERROR(r.extraKeys(&e.extra_keys));
    } else if (key == "group_idx") {
      KVF_RETURN_IF_ERROR(r.optionalInt("group_idx", &e.group_idx));
    } else if (key == "kv_cache_spec_kind") {
      KVF_RETURN_IF_ERROR(r.optionalStr("kv_cache_spec_kind", &e.kv_cache_spec_kind));
    } else if (key == "kv_cache_spec_sliding_window") {
      KVF_RETURN_IF_ERROR(
          r.optionalInt("kv_cache_spec_sliding_window", &e.kv_cache_spec_sliding_window));
    } else {
      r.skip();
    }
  }
  if (!kind) return InvalidArgumentError("event map without \"type\"");
  if (*kind == Kind::kStored) {
    if (!has_block_size) return InvalidArgumentError("BlockStored: no block_size");
    return e;
  }
  if (*kind == Kind::kRemoved) {
    BlockRemoved removed;
    removed.block_hashes = std::move(e.block_hashes);
    removed.medium = std::move(e.medium);
    removed.group_idx = e.group_idx;
    return removed;
  }
  return AllBlocksCleared{};
}

absl::StatusOr<KvEvent> readEvent(Reader& r) {
  if (r.type() == MP_ARRAY) {
    uint32_t n = mp_decode_array(&r.p);
    if (n == 0) return InvalidArgumentError("empty event");
    return readArrayEvent(r, n);
  }
  if (r.type() == MP_MAP) return readMapEvent(r, mp_decode_map(&r.p));
  return InvalidArgumentError("event is neither an array nor a map");
}

absl::Status readEvents(Reader& r, KvEventBatch* batch) {
  KVF_ASSIGN_OR_RETURN(uint32_t n, r.array("events", r.limits.max_events));
  batch->events.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    absl::StatusOr<KvEvent> event = readEvent(r);
    if (!event.ok()) return annotate(event.status(), strCat("event ", i));
    batch->events.push_back(std::move(*event));
  }
  return absl::OkStatus();
}

absl::Status readRank(Reader& r, KvEventBatch* batch) {
  if (r.takeNil()) return absl::OkStatus();
  KVF_ASSIGN_OR_RETURN(batch->data_parallel_rank, r.integer("data_parallel_rank"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvEventBatch> decodeEventBatch(std::string_view payload,
                                              const KvEventLimits& limits) {
  if (!wellFormedMsgpack(payload)) {
    return InvalidArgumentError("KV event batch is not one well-formed msgpack value");
  }
  Reader r{payload.data(), limits};
  KvEventBatch batch;
  if (r.type() == MP_ARRAY) {
    uint32_t n = mp_decode_array(&r.p);
    if (n < 2) return InvalidArgumentError("KV event batch: fewer than 2 fields");
    KVF_ASSIGN_OR_RETURN(batch.ts, r.number("ts"));
    KVF_RETURN_IF_ERROR(readEvents(r, &batch));
    if (n > 2) KVF_RETURN_IF_ERROR(readRank(r, &batch));
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
      KVF_RETURN_IF_ERROR(readEvents(r, &batch));
      has_events = true;
    } else if (key == "data_parallel_rank") {
      KVF_RETURN_IF_ERROR(readRank(r, &batch));
    } else {
      r.skip();
    }
  }
  if (!has_events) return InvalidArgumentError("KV event batch map without \"events\"");
  return batch;
}

}  // namespace kvf::protocol
