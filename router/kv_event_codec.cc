#include "router/kv_event_codec.h"

#include <type_traits>

#include "common/status.h"

namespace kvf::router {
namespace {

// Per block, the digest of what the engine folded into its hash besides the tokens.
std::vector<uint64_t> extraDigests(const protocol::BlockStored& e) {
  const size_t blocks = e.block_hashes.size();
  if (e.extra_keys) {
    std::vector<uint64_t> out(blocks, 0);
    for (size_t i = 0; i < blocks && i < e.extra_keys->size(); ++i) {
      const auto& key = (*e.extra_keys)[i];
      if (key) out[i] = protocol::extraKeysDigest(*key);
    }
    return out;
  }
  // Events older than extra_keys name the adapter only; its name (or, older still, its id) is
  // what vLLM folded into every block of the request.
  if (e.lora_name) {
    return std::vector<uint64_t>(
        blocks, protocol::extraKeysDigest(protocol::encodeLoraOnlyExtraKeys(*e.lora_name)));
  }
  if (e.lora_id) {
    return std::vector<uint64_t>(
        blocks, protocol::extraKeysDigest(protocol::encodeLoraIdOnlyExtraKeys(*e.lora_id)));
  }
  return {};
}

KvEvent toRouterEvent(protocol::KvEvent&& event) {
  KvEvent out;
  std::visit(
      [&](auto&& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, protocol::BlockStored>) {
          out.kind = KvEventKind::kBlockStored;
          std::span<const uint64_t> hashes = protocol::rawHashes(e.block_hashes);
          out.stored.engine_hashes.assign(hashes.begin(), hashes.end());
          out.stored.has_parent = e.parent_block_hash.has_value();
          out.stored.engine_parent =
              e.parent_block_hash.value_or(protocol::EngineBlockHash()).value();
          out.stored.token_ids = std::move(e.token_ids);
          out.stored.block_size = static_cast<size_t>(e.block_size);
          out.stored.extras = extraDigests(e);
          out.medium = std::move(e.medium).value_or("");
          out.group_idx = e.group_idx;
          out.cache_spec_kind = std::move(e.kv_cache_spec_kind).value_or("");
        } else if constexpr (std::is_same_v<T, protocol::BlockRemoved>) {
          out.kind = KvEventKind::kBlockRemoved;
          std::span<const uint64_t> hashes = protocol::rawHashes(e.block_hashes);
          out.removed.assign(hashes.begin(), hashes.end());
          out.medium = std::move(e.medium).value_or("");
          out.group_idx = e.group_idx;
        } else {
          out.kind = KvEventKind::kAllBlocksCleared;
        }
      },
      std::move(event));
  return out;
}

}  // namespace

bool decidesPrefixReuse(std::string_view kind) {
  return kind == "full_attention" || kind == "mla_attention" || kind == "sink_full_attention";
}

absl::StatusOr<KvEventBatch> decodeKvEventBatch(std::string_view payload,
                                                const KvEventLimits& limits) {
  KVF_ASSIGN_OR_RETURN(protocol::KvEventBatch decoded, protocol::decodeEventBatch(payload, limits));
  KvEventBatch batch;
  batch.ts = decoded.ts;
  batch.data_parallel_rank = decoded.data_parallel_rank;
  batch.skipped_events = decoded.skipped_events;
  batch.ignored_fields = decoded.ignored_fields;
  batch.events.reserve(decoded.events.size());
  for (protocol::KvEvent& e : decoded.events) batch.events.push_back(toRouterEvent(std::move(e)));
  return batch;
}

}  // namespace kvf::router
