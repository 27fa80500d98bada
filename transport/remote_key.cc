#include "transport/remote_key.h"

#include <ucs/memory/memory_type.h>

#include <bit>
#include <cstring>

#include "common/status.h"
#include "common/strings.h"

namespace kvf::transport {
namespace {

constexpr uint32_t kMagic = 0x4b52464b;  // "KFRK"
constexpr uint16_t kVersion = 1;

// magic, version, reserved, base, length, ucx length
constexpr size_t kHeaderBytes = 4 + 2 + 2 + 8 + 8 + 4;

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <class T>
void append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

absl::Status bad(std::string_view what) {
  return absl::InvalidArgumentError(strCat("rkey: ", what));
}

// UCX 1.13's ucp_rkey_pack layout: uint64 md_map, uint8 memory type, then for each set bit of
// md_map (ascending) a uint8 size and that many bytes of the domain's key; UCX may append
// device-distance records after them.
absl::Status checkUcxLayout(std::string_view ucx, RemoteKey& key) {
  if (ucx.size() < 9) return bad(strCat("UCX key of ", ucx.size(), " bytes is truncated"));
  key.md_map = load<uint64_t>(ucx.data());
  key.mem_type = static_cast<uint8_t>(ucx[8]);
  if (key.md_map == 0) return bad("UCX key names no memory domain");
  if (key.mem_type >= UCS_MEMORY_TYPE_LAST) {
    return bad(strCat("UCX key has unknown memory type ", int{key.mem_type}));
  }
  size_t at = 9;
  for (int i = 0; i < std::popcount(key.md_map); ++i) {
    if (at >= ucx.size()) return bad(strCat("UCX key ends before domain key ", i));
    const size_t size = static_cast<uint8_t>(ucx[at]);
    if (size > ucx.size() - at - 1) {
      return bad(strCat("UCX domain key ", i, " of ", size, " bytes does not fit"));
    }
    at += 1 + size;
  }
  return absl::OkStatus();
}

}  // namespace

std::string packRemoteKey(uint64_t base, uint64_t length, std::string_view ucx) {
  std::string out;
  out.reserve(kHeaderBytes + ucx.size());
  append(out, kMagic);
  append(out, kVersion);
  append(out, uint16_t{0});
  append(out, base);
  append(out, length);
  append(out, static_cast<uint32_t>(ucx.size()));
  out.append(ucx);
  return out;
}

absl::StatusOr<RemoteKey> parseRemoteKey(std::string_view bytes) {
  if (bytes.size() < kHeaderBytes) return bad(strCat(bytes.size(), " bytes is too short"));
  if (load<uint32_t>(bytes.data()) != kMagic) return bad("not a kvfabric remote key");
  if (load<uint16_t>(bytes.data() + 4) != kVersion) {
    return bad(strCat("unsupported version ", load<uint16_t>(bytes.data() + 4)));
  }
  RemoteKey key;
  key.base = load<uint64_t>(bytes.data() + 8);
  key.length = load<uint64_t>(bytes.data() + 16);
  const uint32_t ucx_bytes = load<uint32_t>(bytes.data() + 24);
  if (key.length == 0) return bad("region length is 0");
  if (key.base + key.length < key.base) return bad("region overflows the address space");
  if (ucx_bytes > kMaxUcxRkeyBytes) {
    return bad(strCat("UCX key of ", ucx_bytes, " bytes exceeds ", kMaxUcxRkeyBytes));
  }
  if (ucx_bytes != bytes.size() - kHeaderBytes) {
    return bad(strCat("UCX key length ", ucx_bytes, " does not match the ",
                      bytes.size() - kHeaderBytes, " bytes that follow"));
  }
  key.ucx = std::string(bytes.substr(kHeaderBytes));
  KVF_RETURN_IF_ERROR(checkUcxLayout(key.ucx, key));
  return key;
}

}  // namespace kvf::transport
