// Remote-decode leases: a prefill instance keeps the blocks of a finished prompt pinned for a
// bounded time so that a decoding peer can pull them (docs/protocols.md, "KV push"). This is the
// bookkeeping only: the owner pins blocks before take() and unpins whatever release(), expire()
// or a replacing take() hands back. Time comes in as arguments. Owned and called by one thread
// (an engine thread: the agent's, or a core driven by a simulator).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"
#include "worker/kv_events.h"

namespace kvf::worker {

struct Lease {
  std::vector<BlockHash> hashes;  // pinned, one pin each
  Nanos expires_at = 0;
  // The lease's full duration; a heartbeat (vLLM NixlConnector) extends expires_at to at least
  // now + duration * 2 / 3. 0: heartbeats do not extend it.
  Nanos duration = 0;
  // Heartbeats never extend expires_at past this (0: no bound): a reader that keeps asking
  // cannot pin the blocks for longer than the holder's lease cap.
  Nanos not_after = 0;
};

class LeaseTable {
 public:
  // Records the pinned `lease` under `id`. A lease already under `id` is replaced: its hashes
  // come back for unpinning.
  std::vector<BlockHash> take(const std::string& id, Lease lease);
  // Removes the lease and returns its hashes to unpin; nullopt when `id` holds none.
  std::optional<std::vector<BlockHash>> release(const std::string& id);
  // Removes the lease and returns it whole (its new owner keeps the pins); nullopt if none.
  std::optional<Lease> detach(const std::string& id);
  // The lease under `id` (owned by the table; valid until the next call), or null. A heartbeat
  // at `now` extends it first: expires_at = max(expires_at, now + duration * 2 / 3), at most
  // not_after.
  const Lease* heartbeat(const std::string& id, Nanos now);
  // Removes every lease due at `now` (expires_at <= now) and returns them, to unpin.
  std::vector<Lease> expire(Nanos now);
  std::optional<Nanos> nextExpiry() const;
  size_t size() const { return leases_.size(); }
  // Blocks pinned by all leases together.
  size_t blocks() const { return blocks_; }
  bool empty() const { return leases_.empty(); }

 private:
  absl::flat_hash_map<std::string, Lease> leases_;
  size_t blocks_ = 0;
};

}  // namespace kvf::worker
