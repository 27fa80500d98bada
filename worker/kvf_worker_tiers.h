// The C ABI's tiers (kvf_worker_tiers in worker/kvf_worker.h) as the EngineAdapter's tier
// methods: what TierPushSource (worker/tier_push.h) is for a C++ engine's TieredStore, this is
// for an engine's C callbacks. It checks every run the engine fills in (a malformed entry ends
// the run) and matches the disk reads the engine reports (kvf_worker_tier_read_done) to the
// agent's waiting pushes. Owned by the C ABI's adapter; pin() and unpin() run on its engine
// thread, region() and readDone() on any thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/log.h"
#include "common/strings.h"
#include "worker/engine_adapter.h"
#include "worker/kvf_worker.h"

namespace kvf::worker {

// The caller's struct as this library's: a caller built against an older header passes a
// smaller struct_size (at least `min_size`) and the fields past it keep their defaults (zero); a
// newer caller's extra fields are accepted only while they are unset (zero bytes). `what` names
// the struct in errors ("config").
template <class CStruct>
absl::StatusOr<CStruct> fullCStruct(const CStruct* c, size_t min_size, std::string_view what) {
  if (c == nullptr) return absl::InvalidArgumentError(strCat(what, ": NULL"));
  const size_t size = c->struct_size;
  if (size < min_size) {
    return absl::InvalidArgumentError(
        strCat(what, ".struct_size: ", size, ", this library needs at least ", min_size));
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(c);
  if (size > sizeof(CStruct) &&
      std::any_of(bytes + sizeof(CStruct), bytes + size, [](unsigned char b) { return b != 0; })) {
    return absl::InvalidArgumentError(strCat(what, ".struct_size: ", size,
                                             ", fields past this library's ", sizeof(CStruct),
                                             " bytes are set"));
  }
  CStruct full{};
  std::memcpy(&full, c, std::min(size, sizeof(CStruct)));
  return full;
}

// The caller's tier table (config.tiers), checked field by field against the pool's block size;
// nullopt when the caller has none.
absl::StatusOr<std::optional<kvf_worker_tiers>> tierTable(const kvf_worker_tiers* tiers,
                                                          uint64_t block_bytes);

class CTierSource {
 public:
  CTierSource(const kvf_worker_tiers& tiers, uint64_t block_bytes)
      : tiers_(tiers), block_bytes_(block_bytes) {}
  CTierSource(const CTierSource&) = delete;
  CTierSource& operator=(const CTierSource&) = delete;

  // Any thread: the engine's host-tier memory.
  PayloadRegion region() const;
  // EngineAdapter::pinTierRun's contract, through tiers.pin_tier_run.
  TierPushRun pin(std::span<const BlockHash> hashes,
                  std::span<const std::span<std::byte>> disk_buffers,
                  absl::AnyInvocable<void(size_t) &&> on_disk_read);
  // EngineAdapter::unpinTierRun's contract, through tiers.unpin_tier_run (not called for 0).
  void unpin(uint64_t id);
  // kvf_worker_tier_read_done: NotFound for an unknown, finished or disk-less read id.
  absl::Status readDone(uint64_t read_id, size_t intact);
  // Drops the reads not yet reported (their pushes gave up long ago); later reports are
  // NotFound. Called once the agent is gone.
  void dropReads();

 private:
  // A run's disk reads, from pin_tier_run's call until both it returned and the engine
  // reported them (in either order).
  struct PendingRead {
    absl::AnyInvocable<void(size_t) &&> on_done;
    bool returned = false;  // pin_tier_run returned: `disk` is known
    size_t disk = 0;        // disk blocks in the run the engine filled in
    std::optional<size_t> intact;
  };
  // The engine's run as the agent's, cut at the first malformed entry.
  TierPushRun checkRun(const kvf_tier_run& run, const kvf_tier_block* blocks, size_t n,
                       size_t num_buffers, size_t* disk_claimed);
  // pin_tier_run returned with `disk` disk blocks: completes the read when nothing is left.
  void returned(uint64_t read_id, size_t disk);

  const kvf_worker_tiers tiers_;
  const uint64_t block_bytes_;
  std::mutex mu_;
  absl::flat_hash_map<uint64_t, PendingRead> reads_;  // guarded by mu_
  uint64_t next_read_ = 1;                            // guarded by mu_
  log::RateLimitedLog malformed_log_;
};

}  // namespace kvf::worker
