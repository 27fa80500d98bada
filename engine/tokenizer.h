// The emulated engine's deterministic tokenizer (documented in docs/engine.md): text splits
// into pieces (a run of letters/digits with its leading space, or one other character), each
// piece maps to a token id by hashing; generated token ids render as fixed pseudo-words. It is
// not invertible and not a real model vocabulary; the replayer sends token ids for exact
// block hashes. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "worker/kv_events.h"

namespace kvf::engine {

// Ids below this are reserved (never produced by tokenize()).
inline constexpr int64_t kReservedTokenIds = 256;

std::vector<worker::TokenId> tokenize(std::string_view text, int64_t vocab_size);
// Text of one generated token: " " followed by a pseudo-word made from the id.
std::string tokenText(worker::TokenId id);

struct ChatMessage {
  std::string role;
  std::string content;
};
// The chat template: "<|role|>\ncontent\n" per message, then "<|assistant|>\n".
std::string applyChatTemplate(const std::vector<ChatMessage>& messages);

}  // namespace kvf::engine
