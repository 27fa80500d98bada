// The identity types every wire contract shares: the token id and the engine block hash. Plain
// values with no dependency beyond the standard library, so any folder may include this header
// (policy/ included: it holds no I/O). Safe from any thread.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <type_traits>
#include <utility>

namespace kvf::protocol {

// A token id, as engines, the router and vLLM's KV events carry it. Every vocabulary in use fits
// in 32 bits (vLLM's largest are ~260k entries), and the router hashes 16 of them per AES block,
// so 32 bits is the one width. Wider values from a peer (JSON or msgpack integers) are
// range-checked where they come in: tokenIdFromWire().
using TokenId = uint32_t;
inline constexpr int64_t kMaxTokenId = std::numeric_limits<TokenId>::max();

// nullopt when `value` does not fit a TokenId (negative or above kMaxTokenId).
constexpr std::optional<TokenId> tokenIdFromWire(int64_t value) {
  if (value < 0 || value > kMaxTokenId) return std::nullopt;
  return static_cast<TokenId>(value);
}

// The hash an engine gives one cached block: what it publishes in KV events, what a receiver
// asks a holder to push, what leases pin. Opaque to everyone but that engine. A type of its own,
// distinct from the router's chained hash over token ids (policy::BlockHash), so that one can
// never be passed where the other is meant: a conversion is always written out.
class EngineBlockHash {
 public:
  constexpr EngineBlockHash() = default;
  constexpr explicit EngineBlockHash(uint64_t value) : value_(value) {}
  constexpr uint64_t value() const { return value_; }

  friend constexpr bool operator==(EngineBlockHash, EngineBlockHash) = default;
  friend constexpr auto operator<=>(EngineBlockHash, EngineBlockHash) = default;
  template <class H>
  friend H AbslHashValue(H h, EngineBlockHash x) {
    return H::combine(std::move(h), x.value_);
  }
  friend std::ostream& operator<<(std::ostream& os, EngineBlockHash x) { return os << x.value_; }

 private:
  uint64_t value_ = 0;
};
static_assert(sizeof(EngineBlockHash) == sizeof(uint64_t));
static_assert(std::is_standard_layout_v<EngineBlockHash> &&
              std::is_trivially_copyable_v<EngineBlockHash>);

// The raw values of a run of engine hashes, without a copy, for interfaces that take 64-bit
// keys (the router's cache index maps engine hashes to its own). A standard-layout class and
// its only member are pointer-interconvertible, so this reads each hash's value in place.
inline std::span<const uint64_t> rawHashes(std::span<const EngineBlockHash> hashes) {
  return {reinterpret_cast<const uint64_t*>(hashes.data()), hashes.size()};
}

}  // namespace kvf::protocol

template <>
struct std::hash<kvf::protocol::EngineBlockHash> {
  size_t operator()(kvf::protocol::EngineBlockHash h) const noexcept {
    return std::hash<uint64_t>{}(h.value());
  }
};
