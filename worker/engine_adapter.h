// What an engine provides to the worker agent that lives inside it (worker/agent.h): its block
// geometry, the payload memory the transport registers, pins on cached blocks, and the receiving
// end of remote KV. The emulated engine implements it (EngineCoreSide,
// engine/engine_server_impl.h); the C ABI (worker/kvf_worker.h) implements it over an engine's
// callbacks.
//
// Threads: the agent never calls the engine from its own threads. It calls post() (any thread)
// and the engine runs what it posted on its *engine thread*, one function at a time, in the order
// posted; every method marked "engine thread" is called only from there, so the engine needs no
// lock around its block table. geometry(), payloadRegion(), tierRegion() and now() may be called
// from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "common/clock.h"
#include "worker/block_table.h"
#include "worker/kv_events.h"
#include "worker/tiers/tier_types.h"

namespace kvf::worker {

struct BlockGeometry {
  int64_t block_size = 0;    // tokens per block
  uint64_t block_bytes = 0;  // payload bytes per block
  uint64_t num_blocks = 0;
};

// The engine's KV payload: block i occupies [data + i * block_bytes, + block_bytes). The memory
// is the engine's and must stay valid (and at this address) for the agent's whole life.
struct PayloadRegion {
  std::byte* data = nullptr;
  uint64_t length = 0;
};

// How a fetch the engine asked for (WorkerAgent::fetch) ended. Reported once per fetch.
struct RemoteKvOutcome {
  std::string id;
  size_t requested = 0;  // blocks asked for
  // The leading landing blocks that hold KV the holder sent, verified against its per-block
  // checksums by the transport. 0: nothing usable arrived.
  size_t landed = 0;
  uint64_t bytes = 0;
  std::string reason;  // why not every block arrived; empty when all did
  // The landing is not resolved: a late write from the holder may still reach the landing
  // blocks the engine does not take over, until releaseLanding(id).
  bool writes_may_arrive = false;
  Nanos elapsed = 0;  // wall time from fetch() to this outcome
};

// One block of a push served from the engine's tiers below its pool (EngineAdapter::pinTierRun).
struct TierPushBlock {
  TierId tier = TierId::kHost;
  // kHost: the block's offset in tierRegion(), where it stays pinned until unpinTierRun().
  // kDisk: the index of the disk buffer it is read into.
  uint64_t offset = 0;
};

// The stride of the disk buffers pinTierRun() reads blocks into: a block rounded up to whole
// 4 KiB sectors, so the disk tier reads straight into them with O_DIRECT.
constexpr uint64_t tierPushBufferStride(uint64_t block_bytes) {
  constexpr uint64_t kSector = 4096;
  return (block_bytes + kSector - 1) / kSector * kSector;
}

// The leading run of a push's remaining blocks that the engine's lower tiers serve, in order.
struct TierPushRun {
  uint64_t id = 0;  // for unpinTierRun(); 0 when nothing is pinned
  std::vector<TierPushBlock> blocks;
  size_t disk = 0;  // blocks of the run being read from disk
  // The run stopped at a disk block because every disk buffer was taken.
  bool out_of_buffers = false;
};

class EngineAdapter {
 public:
  virtual ~EngineAdapter() = default;

  // Any thread. Constant for the adapter's life.
  virtual BlockGeometry geometry() const = 0;
  virtual PayloadRegion payloadRegion() const = 0;
  // Any thread: the engine's clock (leases expire on it), in nanoseconds.
  virtual Nanos now() const = 0;
  // Any thread: runs `fn` on the engine thread, after everything posted before it. After the
  // engine stopped, `fn` may be dropped unrun.
  virtual void post(absl::AnyInvocable<void() &&> fn) = 0;

  // Engine thread. Holder side of a push, and leases: pins the leading run of `hashes` that is
  // cached (each pin keeps its block from eviction and reuse) and returns its block indices, in
  // order; stops at the first hash not cached.
  virtual std::vector<BlockIndex> pinLeadingRun(std::span<const BlockHash> hashes) = 0;
  // Engine thread: undoes one pin per hash (every hash was pinned by pinLeadingRun).
  virtual void unpin(std::span<const BlockHash> hashes) = 0;

  // Holder side of a push, below the pool (host memory G2, local disk G3). An engine without
  // lower tiers keeps the defaults: it serves no block from them (the push answers them missing).
  // Any thread, constant: the host tier's memory, which the agent registers with its transport
  // once so that host blocks are sent from their slots without a copy. Empty: no tiers to serve.
  virtual PayloadRegion tierRegion() const { return {}; }
  // Engine thread. `hashes`: the wanted blocks after the run pinLeadingRun() returned. Returns
  // the leading run of them that the lower tiers hold: host blocks pinned in their slots (not
  // evicted nor reused until unpinTierRun(id)), and at most disk_buffers.size() disk blocks (the
  // run stops before the next), read into disk_buffers in order, block_bytes each, every one
  // checked against its stored checksum (a corrupt block is dropped by its tier and counted,
  // never delivered). `on_disk_read(n)` runs exactly once, on any thread (possibly before this
  // returns), with the number of leading disk blocks read intact; the buffers stay the store's
  // until then.
  virtual TierPushRun pinTierRun(std::span<const BlockHash> hashes,
                                 std::span<const std::span<std::byte>> disk_buffers,
                                 absl::AnyInvocable<void(size_t) &&> on_disk_read) {
    (void)hashes;
    (void)disk_buffers;
    std::move(on_disk_read)(0);
    return {};
  }
  // Engine thread: releases the pins of run `id` (from pinTierRun, once; 0 is ignored).
  virtual void unpinTierRun(uint64_t id) { (void)id; }

  // Engine thread. Receiver side: the engine reserved landing blocks for a fetch and handed them
  // to WorkerAgent::fetch(); the agent answers with exactly one of these two calls, then (after
  // it, possibly at once) exactly one releaseLanding() for the same id.
  // completeRemoteKv: outcome.landed > 0. The first `landed` landing blocks hold KV of the first
  // `landed` hashes; the engine takes them (it may still refuse them, e.g. after a check of its
  // own) and frees the rest. No write can reach any landing block any more.
  virtual void completeRemoteKv(const RemoteKvOutcome& outcome) = 0;
  // failRemoteKv: nothing arrived; the engine computes the KV itself. With
  // outcome.writes_may_arrive it must keep the landing blocks out of use until releaseLanding.
  virtual void failRemoteKv(const RemoteKvOutcome& outcome) = 0;
  // No write can reach the landing blocks of fetch `id` any more (the holder's completion
  // notice arrived, or the holder is gone): the blocks the engine did not take over may be
  // reused. Called once per fetch, after complete/fail.
  virtual void releaseLanding(const std::string& id) = 0;
};

}  // namespace kvf::worker
