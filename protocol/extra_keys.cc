// vLLM's block-hash extra keys (protocol/kv_events.h): the structural digest both the event side
// and the request side fold into the router's hash, and the tuples a request's inputs give.
#include <msgpuck.h>
#include <xxhash.h>

#include "protocol/kv_events.h"

namespace kvf::protocol {
namespace {

constexpr int kMaxDepth = 8;

// Feeds one msgpack value into `state` as (type, content), recursively. False on a value too
// deep or of a kind vLLM never puts in a key (ext).
bool digestValue(XXH3_state_t* state, const char** p, int depth) {
  if (depth > kMaxDepth) return false;
  auto put = [&](char tag, const void* data, size_t size) {
    XXH3_64bits_update(state, &tag, 1);
    XXH3_64bits_update(state, data, size);
  };
  switch (mp_typeof(**p)) {
    case MP_NIL:
      mp_decode_nil(p);
      put('n', "", 0);
      return true;
    case MP_BOOL: {
      char b = mp_decode_bool(p) ? 1 : 0;
      put('t', &b, 1);
      return true;
    }
    case MP_UINT: {
      uint64_t v = mp_decode_uint(p);
      // Non-negative ints are one domain whatever their width; above INT64_MAX they stay apart.
      put(v > static_cast<uint64_t>(INT64_MAX) ? 'u' : 'i', &v, sizeof v);
      return true;
    }
    case MP_INT: {
      int64_t v = mp_decode_int(p);
      put('i', &v, sizeof v);
      return true;
    }
    case MP_FLOAT:
    case MP_DOUBLE: {
      double v = mp_typeof(**p) == MP_FLOAT ? mp_decode_float(p) : mp_decode_double(p);
      put('f', &v, sizeof v);
      return true;
    }
    case MP_STR:
    case MP_BIN: {
      char tag = mp_typeof(**p) == MP_STR ? 's' : 'b';
      uint32_t len = 0;
      const char* s = mp_decode_strbin(p, &len);
      uint64_t n = len;
      put(tag, &n, sizeof n);
      XXH3_64bits_update(state, s, len);
      return true;
    }
    case MP_ARRAY:
    case MP_MAP: {
      bool map = mp_typeof(**p) == MP_MAP;
      uint64_t n = map ? mp_decode_map(p) : mp_decode_array(p);
      put(map ? 'm' : 'a', &n, sizeof n);
      for (uint64_t i = 0; i < (map ? 2 * n : n); ++i) {
        if (!digestValue(state, p, depth + 1)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

char* encodeStr(char* p, std::string_view s) {
  return mp_encode_str(p, s.data(), static_cast<uint32_t>(s.size()));
}

char* encodeInt(char* p, int64_t v) {
  return v >= 0 ? mp_encode_uint(p, static_cast<uint64_t>(v)) : mp_encode_int(p, v);
}

}  // namespace

uint64_t extraKeysDigest(std::string_view msgpack_value) {
  const char* check = msgpack_value.data();
  const char* end = msgpack_value.data() + msgpack_value.size();
  if (msgpack_value.empty() || mp_check(&check, end) != 0 || check != end) return 0;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset_withSeed(state, 0x6b76662d6578746bULL);
  const char* p = msgpack_value.data();
  bool ok = digestValue(state, &p, 0);
  uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!ok) return 0;
  return digest == 0 ? 1 : digest;
}

std::optional<std::string> encodeExtraKeys(const ExtraKeyInputs& inputs, int64_t block_start,
                                           int64_t block_size) {
  const int64_t block_end = block_start + block_size;
  std::vector<const MultimodalItem*> items;
  size_t bytes = 16 + inputs.lora_name.size() + inputs.cache_salt.size();
  for (const MultimodalItem& item : inputs.mm_items) {
    if (item.offset < block_end && item.offset + item.length > block_start) {
      items.push_back(&item);
      bytes += 32 + item.identifier.size();
    }
  }
  const bool lora = !inputs.lora_name.empty();
  const bool salt = !inputs.cache_salt.empty() && block_start == 0;
  const size_t n = (lora ? 1 : 0) + items.size() + (salt ? 1 : 0);
  if (n == 0) return std::nullopt;
  std::string out(bytes, '\0');
  char* p = mp_encode_array(out.data(), static_cast<uint32_t>(n));
  if (lora) p = encodeStr(p, inputs.lora_name);
  for (const MultimodalItem* item : items) {
    p = mp_encode_array(p, 2);
    p = encodeStr(p, item->identifier);
    p = encodeInt(p, item->offset - block_start);
  }
  if (salt) p = encodeStr(p, inputs.cache_salt);
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

std::string encodeLoraOnlyExtraKeys(std::string_view lora_name) {
  std::string out(16 + lora_name.size(), '\0');
  char* p = mp_encode_array(out.data(), 1);
  p = encodeStr(p, lora_name);
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

std::string encodeLoraIdOnlyExtraKeys(int64_t lora_id) {
  std::string out(16, '\0');
  char* p = mp_encode_array(out.data(), 1);
  p = encodeInt(p, lora_id);
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

}  // namespace kvf::protocol
