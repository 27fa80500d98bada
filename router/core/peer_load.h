// Router replicas share their in-flight load (docs/router.md "Replicas"). Each replica's
// ReplicaLoadPublisher turns its own per-instance load into numbered messages: a delta of what
// changed since the last message, and now and then a snapshot of all of it. Each replica's
// PeerLoadTable applies its peers' messages in sequence and sums their load per instance; a
// sequence gap stops deltas until that peer's next snapshot, a new epoch (the peer restarted)
// starts it over, and a peer silent for peer_timeout is dropped with its load. No I/O and no
// clock: times are arguments, so kvf-router and the simulator drive the same code.
// Single-threaded: each object belongs to its owner's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "router/core/ledger.h"

namespace kvf::router {

struct ReplicaLoadEntry {
  std::string instance;  // the instance's id (replicas may number their slots differently)
  InFlightLoad load;     // a delta's change, or a snapshot's absolute figures
};

struct ReplicaMessage {
  enum class Kind : uint8_t { kDelta = 0, kSnapshot = 1 };
  Kind kind = Kind::kDelta;
  std::string replica;  // the sender's id
  uint64_t epoch = 0;   // random per sender process: a restart starts a new sequence
  uint64_t seq = 0;     // +1 per message of the epoch, deltas and snapshots alike
  int64_t sent_unix_ns = 0;
  std::vector<ReplicaLoadEntry> entries;
};

// Builds one replica's messages from its own load, by instance id.
class ReplicaLoadPublisher {
 public:
  ReplicaLoadPublisher(std::string replica, uint64_t epoch)
      : replica_(std::move(replica)), epoch_(epoch) {}

  // The changes since the last message; false (nothing built) when nothing changed. An
  // instance absent from `own` counts as idle.
  bool delta(const std::map<std::string, InFlightLoad>& own, int64_t unix_ns, ReplicaMessage* out);
  // Every non-idle instance's load, absolute.
  void snapshot(const std::map<std::string, InFlightLoad>& own, int64_t unix_ns,
                ReplicaMessage* out);
  uint64_t lastSeq() const { return seq_; }

 private:
  void start(ReplicaMessage::Kind kind, int64_t unix_ns, ReplicaMessage* out);

  std::string replica_;
  uint64_t epoch_;
  uint64_t seq_ = 0;
  std::map<std::string, InFlightLoad> published_;  // what the peers hold after the last message
};

struct PeerLoadLimits {
  size_t max_peers = 64;
  size_t max_instances = 1024;  // instances one peer may report load on
  // Counts a peer may report on one instance: larger figures are clamped, so a hostile peer
  // cannot make an instance look infinitely loaded.
  int64_t max_running = 1 << 20;
  int64_t max_tokens = int64_t{1} << 40;
};

class PeerLoadTable {
 public:
  PeerLoadTable(std::string self, Nanos peer_timeout, PeerLoadLimits limits = {})
      : self_(std::move(self)), peer_timeout_(peer_timeout), limits_(limits) {}

  enum class Outcome {
    kApplied,
    kGap,             // a delta past a missing one: the peer waits for its next snapshot
    kAwaitingResync,  // a delta while waiting for a snapshot: ignored
    kDuplicate,       // its sequence number was seen already: ignored
    kSelf,            // our own id: ignored
    kTooManyPeers,    // a new peer past max_peers: ignored
    kTooLarge,        // more instances than max_instances: ignored
  };
  // Applies `message` received at `now` (the receiver's clock).
  Outcome apply(const ReplicaMessage& message, Nanos now);
  // Drops every peer heard from last before now - peer_timeout; the number dropped.
  size_t expire(Nanos now);
  // The live peers' load on `instance`, summed.
  InFlightLoad total(std::string_view instance) const;

  struct PeerView {
    std::string id;
    uint64_t epoch = 0;
    uint64_t seq = 0;
    bool synced = false;  // has a snapshot since its last gap or restart
    Nanos last_heard = 0;
    InFlightLoad load;  // summed over instances
  };
  std::vector<PeerView> peers() const;
  size_t peersUp() const { return peers_.size(); }
  // The longest time since a live peer was last heard (0 with none).
  Nanos maxSilence(Nanos now) const;
  uint64_t gaps() const { return gaps_; }
  uint64_t expired() const { return expired_; }

 private:
  struct Peer {
    uint64_t epoch = 0;
    uint64_t seq = 0;
    bool synced = false;
    Nanos last_heard = 0;
    std::unordered_map<std::string, InFlightLoad> load;
  };
  InFlightLoad clamp(InFlightLoad load) const;

  std::string self_;
  Nanos peer_timeout_;
  PeerLoadLimits limits_;
  std::map<std::string, Peer, std::less<>> peers_;
  uint64_t gaps_ = 0;
  uint64_t expired_ = 0;
};

}  // namespace kvf::router
