// The engine's own chained block hash (xxh3-64 over the parent hash and the block's token ids,
// with an engine-specific seed) and the deterministic "sampler" that picks generated tokens.
// Both are internal to the engine: routers map engine hashes through BlockStored token_ids.
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <span>

#include "worker/kv_events.h"

namespace kvf::engine {

// Hash of a full block: parent is the previous block's hash (0 for the first block).
worker::BlockHash hashBlock(uint64_t seed, worker::BlockHash parent,
                            std::span<const worker::TokenId> tokens);

// Hash of a full block of a token-free prompt, identified by its content key (PromptBlocks).
worker::BlockHash hashBlockKey(uint64_t seed, worker::BlockHash parent, uint64_t key);
// Content key of full block `index` of a token-free request that holds generated tokens (the
// prompt's partial last block and what follows): a function of the prompt (content_seed) and
// the position, as the generated tokens are.
uint64_t generatedBlockKey(uint64_t content_seed, int64_t index);

// Seed of a request's generated tokens: a function of the prompt only, so every run, cache
// state and preemption history gives the same output.
uint64_t outputSeed(std::span<const worker::TokenId> prompt);
// The generated token at output position `index` (in [0, vocab_size)).
worker::TokenId generatedToken(uint64_t seed, int64_t index, int64_t vocab_size);

}  // namespace kvf::engine
