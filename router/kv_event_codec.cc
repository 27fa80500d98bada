#include "router/kv_event_codec.h"

#include <type_traits>

#include "common/status.h"

namespace kvf::router {
namespace {

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
          out.medium = std::move(e.medium).value_or("");
        } else if constexpr (std::is_same_v<T, protocol::BlockRemoved>) {
          out.kind = KvEventKind::kBlockRemoved;
          std::span<const uint64_t> hashes = protocol::rawHashes(e.block_hashes);
          out.removed.assign(hashes.begin(), hashes.end());
          out.medium = std::move(e.medium).value_or("");
        } else {
          out.kind = KvEventKind::kAllBlocksCleared;
        }
      },
      std::move(event));
  return out;
}

}  // namespace

absl::StatusOr<KvEventBatch> decodeKvEventBatch(std::string_view payload,
                                                const KvEventLimits& limits) {
  KVF_ASSIGN_OR_RETURN(protocol::KvEventBatch decoded, protocol::decodeEventBatch(payload, limits));
  KvEventBatch batch;
  batch.ts = decoded.ts;
  batch.data_parallel_rank = decoded.data_parallel_rank;
  batch.events.reserve(decoded.events.size());
  for (protocol::KvEvent& e : decoded.events) batch.events.push_back(toRouterEvent(std::move(e)));
  return batch;
}

}  // namespace kvf::router
