// Our own chained 64-bit block hash over token ids, independent of any engine's hash function:
// h_i = mix(h_{i-1}, content(tokens of block i)), content hashes independent of each other so
// consecutive blocks hash in parallel (16-token blocks: an AES-round construction, AES-NI when
// the CPU has it, else a portable equal path; other sizes: xxh3). Only full blocks are hashed.
// Pure functions; safe from any thread.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "protocol/wire_types.h"

namespace kvf::policy {

// A block hash of the router's own chain, a distinct type so that it is never mixed with an
// engine's block hash (protocol::EngineBlockHash, from its KV events) by accident: the cache
// index maps one to the other; where an engine hashes as we do (a simulator's engine), the
// conversion is written out. Eight bytes, trivially copyable: no cost over a bare uint64_t.
struct BlockHash {
  uint64_t value;

  friend constexpr bool operator==(BlockHash, BlockHash) = default;
  friend constexpr std::strong_ordering operator<=>(BlockHash, BlockHash) = default;
  template <class H>
  friend H AbslHashValue(H h, BlockHash b) {
    return H::combine(std::move(h), b.value);
  }
};
static_assert(sizeof(BlockHash) == sizeof(uint64_t) && std::is_trivially_copyable_v<BlockHash>);

using TokenId = protocol::TokenId;
// A word of instances (bit i: instance i), the inline part of a holder set (policy/holder_set.h).
using InstanceMask = uint64_t;

// Parent of the first block of every prompt.
inline constexpr BlockHash kRootBlockHash{0x6b76666162726963ULL};  // "kvfabric"
inline constexpr size_t kDefaultBlockSize = 16;

// Hash of one block given its parent's hash; `tokens` must hold exactly one block.
BlockHash hashBlock(BlockHash parent, std::span<const TokenId> tokens);

// Chained hashes of every full block of `tokens` (a trailing partial block is not hashed),
// appended to `out`. `block_size` must be > 0.
void hashTokenBlocks(std::span<const TokenId> tokens, size_t block_size,
                     std::vector<BlockHash>* out, BlockHash parent = kRootBlockHash);
std::vector<BlockHash> hashTokenBlocks(std::span<const TokenId> tokens, size_t block_size);
// The same into caller-owned memory: the chained hashes of the first out.size() blocks of
// `tokens` from `parent` (only as many as `tokens` holds in full; the rest of `out` is left
// alone). Returns the last hash written, `parent` when none. No allocation: for pipelined
// callers.
BlockHash hashTokenBlocksTo(std::span<const TokenId> tokens, size_t block_size, BlockHash parent,
                            std::span<BlockHash> out);
// Appends the hashes of the full blocks of `tokens` that `hashes` (a prefix of the prompt's
// chained hashes, possibly empty) does not cover yet.
void completeBlockHashes(std::span<const TokenId> tokens, size_t block_size,
                         std::vector<BlockHash>* hashes);

// Extra keys: what an engine folds into a block's hash besides its tokens (vLLM: LoRA name,
// multimodal items, cache salt; see docs/vllm.md), given as one nonzero 64-bit digest per block
// (0: none). Block i's hash is then hashBlock(keyedParent(h_{i-1}, extra_i), tokens of block
// i): a block with no keys hashes exactly as without this, and equal tokens under different
// keys never share a hash, nor does anything chained after them.
BlockHash keyedParent(BlockHash parent, uint64_t extra_digest);
// hashTokenBlocks with per-block extra digests (`extras[i]` for block i; blocks past
// extras.size() have none).
std::vector<BlockHash> hashTokenBlocksWithExtras(std::span<const TokenId> tokens, size_t block_size,
                                                 std::span<const uint64_t> extras);

// Token-free prompts (a simulator replaying a trace of block ids): a block identified by a
// content key (equal keys = equal tokens) instead of its tokens. Same chain, separate content
// domain. hashKeyBlocks appends the chained hashes of `keys` (one per full block) to `out`.
BlockHash hashBlockKey(BlockHash parent, uint64_t key);
void hashKeyBlocks(std::span<const uint64_t> keys, std::vector<BlockHash>* out,
                   BlockHash parent = kRootBlockHash);

// Approximate index for prompts the router cannot tokenize: chained hashes over full blocks of
// `bytes_per_block` bytes of text. Separate domain from token hashes (different root).
// `extra_digest` (nonzero) keys the whole chain, as a request's LoRA adapter or salt would.
std::vector<BlockHash> hashTextBlocks(std::string_view text, size_t bytes_per_block,
                                      uint64_t extra_digest = 0);

// A 64-bit key for an engine's block hash sent as bytes (newer vLLM sends 32-byte digests).
uint64_t engineHashFromBytes(std::string_view bytes);

// For tests: the content hash of one 16-token block through each implementation. Native
// (AES-NI) returns false when this CPU or build has none; both must always agree.
namespace internal {
uint64_t contentHash16Portable(const TokenId* tokens);
bool contentHash16Native(const TokenId* tokens, uint64_t* out);
}  // namespace internal

}  // namespace kvf::policy
