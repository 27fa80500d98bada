// Sequence-number frames of the KV-event stream (vLLM's format, docs/protocols.md): an 8-byte
// big-endian unsigned integer per batch; all ones (-1 signed) ends a replay. Shared by the
// worker's publisher and the router's subscriber. Header-only; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvf::kv_events {

inline constexpr uint64_t kReplayEndSeq = ~uint64_t{0};

inline std::string encodeSeq(uint64_t seq) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[static_cast<size_t>(i)] = static_cast<char>(seq & 0xff);
    seq >>= 8;
  }
  return out;
}

// nullopt unless the frame is exactly 8 bytes.
inline std::optional<uint64_t> decodeSeq(std::string_view frame) {
  if (frame.size() != 8) return std::nullopt;
  uint64_t seq = 0;
  for (unsigned char c : frame) seq = (seq << 8) | c;
  return seq;
}

}  // namespace kvf::kv_events
