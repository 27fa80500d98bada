#include "protocol/kv_events.h"

#include <msgpuck.h>

#include <type_traits>

#include "common/status.h"
#include "common/strings.h"

namespace kvf::protocol {
namespace {

using absl::InvalidArgumentError;

// ---- encoding ----

// Appends msgpack values to a string; sizes come from msgpuck's mp_sizeof_* helpers.
class Encoder {
 public:
  explicit Encoder(std::string* out) : out_(out) {}

  Encoder& array(uint32_t n) {
    return put(mp_sizeof_array(n), [&](char* p) { return mp_encode_array(p, n); });
  }
  Encoder& map(uint32_t n) {
    return put(mp_sizeof_map(n), [&](char* p) { return mp_encode_map(p, n); });
  }
  Encoder& str(std::string_view s) {
    auto n = static_cast<uint32_t>(s.size());
    return put(mp_sizeof_str(n), [&](char* p) { return mp_encode_str(p, s.data(), n); });
  }
  Encoder& uint(uint64_t v) {
    return put(mp_sizeof_uint(v), [&](char* p) { return mp_encode_uint(p, v); });
  }
  Encoder& integer(int64_t v) {
    if (v >= 0) return uint(static_cast<uint64_t>(v));
    return put(mp_sizeof_int(v), [&](char* p) { return mp_encode_int(p, v); });
  }
  Encoder& nil() {
    return put(mp_sizeof_nil(), [](char* p) { return mp_encode_nil(p); });
  }
  Encoder& float64(double v) {
    return put(mp_sizeof_double(v), [&](char* p) { return mp_encode_double(p, v); });
  }
  Encoder& raw(std::string_view msgpack) {
    out_->append(msgpack);
    return *this;
  }

  Encoder& hashes(const std::vector<EngineBlockHash>& v) {
    array(static_cast<uint32_t>(v.size()));
    for (EngineBlockHash h : v) uint(h.value());
    return *this;
  }
  Encoder& optionalHash(const std::optional<EngineBlockHash>& h) {
    return h ? uint(h->value()) : nil();
  }
  Encoder& optionalInt(const std::optional<int64_t>& v) { return v ? integer(*v) : nil(); }
  Encoder& optionalStr(const std::optional<std::string>& s) { return s ? str(*s) : nil(); }
  Encoder& tokens(const std::vector<TokenId>& v) {
    array(static_cast<uint32_t>(v.size()));
    for (TokenId t : v) uint(t);
    return *this;
  }
  // Each entry is one msgpack value already (vLLM's tuple, as decoded).
  Encoder& extraKeys(const std::optional<std::vector<std::optional<std::string>>>& keys) {
    if (!keys) return nil();
    array(static_cast<uint32_t>(keys->size()));
    for (const auto& k : *keys) k ? raw(*k) : nil();
    return *this;
  }

 private:
  template <class F>
  Encoder& put(uint32_t size, F encode) {
    size_t at = out_->size();
    out_->resize(at + size);
    encode(out_->data() + at);
    return *this;
  }

  std::string* out_;
};

// BlockStored's fields after medium, in vLLM's order; each has a default (None).
constexpr int kStoredOptionalFields = 5;

int storedTrailingFields(const BlockStored& e) {
  if (e.kv_cache_spec_sliding_window) return 5;
  if (e.kv_cache_spec_kind) return 4;
  if (e.group_idx) return 3;
  if (e.extra_keys) return 2;
  return e.lora_name ? 1 : 0;
}

void encodeStoredArray(Encoder& e, const BlockStored& ev) {
  // lora_name has no default in vLLM, but publishers older than it wrote 7 fields: it is written
  // only when set or followed by a set field, so today's bytes match those publishers.
  int trailing = storedTrailingFields(ev);
  e.array(static_cast<uint32_t>(7 + trailing));
  e.str("BlockStored");
  e.hashes(ev.block_hashes);
  e.optionalHash(ev.parent_block_hash);
  e.tokens(ev.token_ids);
  e.integer(ev.block_size);
  e.optionalInt(ev.lora_id);
  e.optionalStr(ev.medium);
  if (trailing > 0) e.optionalStr(ev.lora_name);
  if (trailing > 1) e.extraKeys(ev.extra_keys);
  if (trailing > 2) e.optionalInt(ev.group_idx);
  if (trailing > 3) e.optionalStr(ev.kv_cache_spec_kind);
  if (trailing > 4) e.optionalInt(ev.kv_cache_spec_sliding_window);
  static_assert(kStoredOptionalFields == 5);
}

void encodeStoredMap(Encoder& e, const BlockStored& ev) {
  uint32_t n = 8 + (ev.extra_keys ? 1 : 0) + (ev.group_idx ? 1 : 0) +
               (ev.kv_cache_spec_kind ? 1 : 0) + (ev.kv_cache_spec_sliding_window ? 1 : 0) +
               (ev.locality ? 1 : 0);
  e.map(n);
  e.str("type").str("BlockStored");
  e.str("block_hashes").hashes(ev.block_hashes);
  e.str("parent_block_hash").optionalHash(ev.parent_block_hash);
  e.str("token_ids").tokens(ev.token_ids);
  e.str("block_size").integer(ev.block_size);
  e.str("lora_id").optionalInt(ev.lora_id);
  e.str("medium").optionalStr(ev.medium);
  e.str("lora_name").optionalStr(ev.lora_name);
  if (ev.extra_keys) e.str("extra_keys").extraKeys(ev.extra_keys);
  if (ev.group_idx) e.str("group_idx").integer(*ev.group_idx);
  if (ev.kv_cache_spec_kind) e.str("kv_cache_spec_kind").str(*ev.kv_cache_spec_kind);
  if (ev.kv_cache_spec_sliding_window) {
    e.str("kv_cache_spec_sliding_window").integer(*ev.kv_cache_spec_sliding_window);
  }
  if (ev.locality) e.str("locality").str(*ev.locality);  // map events only, as in vLLM
}

bool hasLocality(const KvEvent& event) {
  if (const auto* s = std::get_if<BlockStored>(&event)) return s->locality.has_value();
  if (const auto* r = std::get_if<BlockRemoved>(&event)) return r->locality.has_value();
  return false;
}

void encodeEvent(Encoder& e, const KvEvent& event, KvEventLayout layout) {
  const bool map = layout == KvEventLayout::kMap || hasLocality(event);
  std::visit(
      [&](const auto& ev) {
        using T = std::decay_t<decltype(ev)>;
        if constexpr (std::is_same_v<T, BlockStored>) {
          map ? encodeStoredMap(e, ev) : encodeStoredArray(e, ev);
        } else if constexpr (std::is_same_v<T, BlockRemoved>) {
          const uint32_t n = 3 + (ev.group_idx ? 1 : 0);
          if (map) {
            e.map(n + (ev.locality ? 1 : 0));
            e.str("type").str("BlockRemoved");
            e.str("block_hashes").hashes(ev.block_hashes);
            e.str("medium").optionalStr(ev.medium);
            if (ev.group_idx) e.str("group_idx").integer(*ev.group_idx);
            if (ev.locality) e.str("locality").str(*ev.locality);
          } else {
            e.array(n);
            e.str("BlockRemoved");
            e.hashes(ev.block_hashes);
            e.optionalStr(ev.medium);
            if (ev.group_idx) e.integer(*ev.group_idx);
          }
        } else {
          if (map) {
            e.map(1).str("type");
          } else {
            e.array(1);
          }
          e.str("AllBlocksCleared");
        }
      },
      event);
}

}  // namespace

std::string encodeEventBatch(const KvEventBatch& batch, KvEventLayout layout) {
  std::string out;
  Encoder e(&out);
  const bool rank = batch.data_parallel_rank.has_value();
  if (layout == KvEventLayout::kMap) {
    e.map(rank ? 3 : 2);
    e.str("ts");
  } else {
    e.array(rank ? 3 : 2);
  }
  e.float64(batch.ts);
  if (layout == KvEventLayout::kMap) e.str("events");
  e.array(static_cast<uint32_t>(batch.events.size()));
  for (const auto& ev : batch.events) encodeEvent(e, ev, layout);
  if (rank) {
    if (layout == KvEventLayout::kMap) e.str("data_parallel_rank");
    e.integer(*batch.data_parallel_rank);
  }
  return out;
}

EngineBlockHash engineHashFromBytes(std::string_view bytes) {
  uint64_t v = 0;
  for (unsigned char c : bytes.substr(bytes.size() > 8 ? bytes.size() - 8 : 0)) v = (v << 8) | c;
  return EngineBlockHash(v);
}

std::string encodeSeq(uint64_t seq) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[static_cast<size_t>(i)] = static_cast<char>(seq & 0xff);
    seq >>= 8;
  }
  return out;
}

std::optional<uint64_t> decodeSeq(std::string_view frame) {
  if (frame.size() != 8) return std::nullopt;
  uint64_t seq = 0;
  for (unsigned char c : frame) seq = (seq << 8) | c;
  return seq;
}

}  // namespace kvf::protocol
