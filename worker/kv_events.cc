#include "worker/kv_events.h"

#include <msgpuck.h>

#include <type_traits>

namespace kvf::worker {
namespace {

// Appends msgpack values to a string; sizes come from msgpuck's mp_sizeof_* helpers.
class Encoder {
 public:
  explicit Encoder(std::string* out) : out_(out) {}

  void array(uint32_t n) {
    put(mp_sizeof_array(n), [&](char* p) { return mp_encode_array(p, n); });
  }
  void str(std::string_view s) {
    auto n = static_cast<uint32_t>(s.size());
    put(mp_sizeof_str(n), [&](char* p) { return mp_encode_str(p, s.data(), n); });
  }
  void uint(uint64_t v) {
    put(mp_sizeof_uint(v), [&](char* p) { return mp_encode_uint(p, v); });
  }
  void integer(int64_t v) {
    if (v >= 0) return uint(static_cast<uint64_t>(v));
    put(mp_sizeof_int(v), [&](char* p) { return mp_encode_int(p, v); });
  }
  void nil() {
    put(mp_sizeof_nil(), [](char* p) { return mp_encode_nil(p); });
  }
  void float64(double v) {
    put(mp_sizeof_double(v), [&](char* p) { return mp_encode_double(p, v); });
  }

 private:
  template <class F>
  void put(uint32_t size, F encode) {
    size_t at = out_->size();
    out_->resize(at + size);
    encode(out_->data() + at);
  }

  std::string* out_;
};

void encodeEvent(Encoder& e, const KvEvent& event) {
  std::visit(
      [&](const auto& ev) {
        using T = std::decay_t<decltype(ev)>;
        if constexpr (std::is_same_v<T, BlockStored>) {
          e.array(7);
          e.str("BlockStored");
          e.array(static_cast<uint32_t>(ev.block_hashes.size()));
          for (BlockHash h : ev.block_hashes) e.uint(h);
          if (ev.parent_block_hash) {
            e.uint(*ev.parent_block_hash);
          } else {
            e.nil();
          }
          e.array(static_cast<uint32_t>(ev.token_ids.size()));
          for (TokenId t : ev.token_ids) e.integer(t);
          e.integer(ev.block_size);
          e.nil();  // lora_id
          e.str("GPU");
        } else if constexpr (std::is_same_v<T, BlockRemoved>) {
          e.array(3);
          e.str("BlockRemoved");
          e.array(static_cast<uint32_t>(ev.block_hashes.size()));
          for (BlockHash h : ev.block_hashes) e.uint(h);
          e.str("GPU");
        } else {
          e.array(1);
          e.str("AllBlocksCleared");
        }
      },
      event);
}

}  // namespace

std::string encodeEventBatch(double timestamp_s, const std::vector<KvEvent>& events) {
  std::string out;
  Encoder e(&out);
  e.array(2);
  e.float64(timestamp_s);
  e.array(static_cast<uint32_t>(events.size()));
  for (const auto& ev : events) encodeEvent(e, ev);
  return out;
}

void VectorEventSink::onBlockStored(BlockStored event) {
  events_.emplace_back(std::in_place_type<BlockStored>, std::move(event));
}
void VectorEventSink::onBlockRemoved(BlockRemoved event) {
  events_.emplace_back(std::in_place_type<BlockRemoved>, std::move(event));
}
void VectorEventSink::onAllBlocksCleared() { events_.emplace_back(AllBlocksCleared{}); }

}  // namespace kvf::worker
