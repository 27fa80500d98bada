// Overload control for the routing core: the saturation thresholds and the router-side queue
// (`overload:` in the router's YAML, docs/router.md). A request that no instance can start soon
// waits here instead of being committed to an engine that is already saturated; queued requests
// leave in deficit-round-robin order across sessions, each charged its estimated uncached
// prefill tokens, so one session with long contexts cannot starve the others; past the queue's
// bounds a request is shed (the driver answers 429 with Retry-After). Owned by one RoutingCore
// and called from its thread only. Tickets are the driver's request ids.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/clock.h"

namespace kvf::router {

struct OverloadConfig {
  bool enabled = false;
  // An instance is saturated (it cannot start another request soon) when any of these holds.
  // Uncached prompt tokens routed to it and not yet past their first token (router-accounted,
  // so it moves at once with every decision).
  int64_t max_pending_prefill_tokens = 65536;
  int64_t max_waiting = 16;   // requests queued in the engine (its /metrics)
  double max_kv_usage = 1.0;  // KV usage (its /metrics); 1.0: not a signal (a full cache
                              // of idle blocks is no queue)
  int64_t max_running = 0;    // requests in flight on it; 0: no bound
  // Offer the policy only unsaturated instances while there are any. Off: the queue only
  // gates when a request is decided, and the policy still weighs a saturated cache holder.
  bool steer = false;
  // The router-side queue.
  int64_t max_queue = 4096;               // queued requests; past it new ones are shed (queue_full)
  int64_t max_per_session = 64;           // one session's queued requests (session_share)
  Nanos max_wait = 60 * kNanosPerSecond;  // longest wait in the queue (wait_timeout)
  int64_t quantum_tokens = 16384;         // deficit round robin: tokens per session per round
  int retry_after_s = 1;                  // the 429's Retry-After
};

enum class ShedReason { kQueueFull, kSessionShare, kWaitTimeout };
inline constexpr int kShedReasons = 3;
std::string_view shedReasonName(ShedReason r);

// Counters and the wait-time histogram, for /metrics and the simulator's metrics.
struct OverloadStats {
  // Upper bounds of the wait-time histogram's buckets, in seconds (the last bucket is +Inf).
  static constexpr std::array<double, 12> kWaitBuckets = {0.01, 0.05, 0.1, 0.25, 0.5, 1,
                                                          2.5,  5,    10,  30,   60,  300};
  uint64_t admitted_at_once = 0;  // went to an instance without waiting
  uint64_t queued = 0;            // waited in the queue
  uint64_t dispatched = 0;        // left the queue for an instance
  uint64_t cancelled = 0;         // left the queue because the client did
  std::array<uint64_t, kShedReasons> shed{};
  std::array<uint64_t, kWaitBuckets.size() + 1> wait_buckets{};  // non-cumulative counts
  double wait_sum_s = 0;
  uint64_t wait_count = 0;
  int64_t max_depth = 0;

  void recordWait(Nanos wait);
  // Prometheus text: kvfabric_router_queue_depth (gauge, `depth`), ..._queue_wait_seconds
  // (histogram), ..._queued_total, ..._admitted_total, ..._queue_cancelled_total and
  // ..._shed_total{reason}.
  std::string prometheusText(int64_t depth) const;
};

// The queue itself: per-session FIFOs served by deficit round robin over sessions in order of
// arrival. A session's queue is charged the cost of each request it sends on (its estimated
// uncached prompt tokens, capped at kMaxRounds quanta so a pop stays bounded).
class AdmissionQueue {
 public:
  static constexpr int64_t kMaxRounds = 16;

  explicit AdmissionQueue(const OverloadConfig& config) : config_(config) {}

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Adds `ticket` (unique while queued) for `session` (empty: a session of its own). A shed
  // reason when the queue or the session's share is full.
  std::optional<ShedReason> push(uint64_t ticket, std::string_view session, int64_t cost,
                                 Nanos now);
  // The next ticket in deficit-round-robin order and when it was queued; nullopt when empty.
  struct Popped {
    uint64_t ticket = 0;
    Nanos queued_at = 0;
  };
  std::optional<Popped> pop();
  // Removes a queued ticket; its queue time, or nullopt when it was not queued.
  std::optional<Nanos> remove(uint64_t ticket);

 private:
  struct Entry {
    uint64_t ticket;
    int64_t cost;
    Nanos queued_at;
  };
  struct SessionQueue {
    std::deque<Entry> entries;
    int64_t deficit = 0;
    bool credited = false;  // got this round's quantum
  };
  void dropIfEmpty(const std::string& key);

  const OverloadConfig& config_;
  std::unordered_map<std::string, SessionQueue> sessions_;
  std::unordered_map<uint64_t, std::string> session_of_;  // ticket -> session key
  std::deque<std::string> active_;                        // sessions with queued entries
  int64_t size_ = 0;
};

}  // namespace kvf::router
