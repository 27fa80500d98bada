// Internal to experiments/sim/: the simulator's state (event queue, client flights, the routing
// core, engine cores) shared by cluster_sim.cc (event loop and client), sim_router.cc (the
// router's events, driving router/core/routing_core.h as kvf-router does) and sim_engines.cc
// (engine steps, KV events, health and failures). Single-threaded.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "experiments/replay/result_log.h"
#include "experiments/sim/cluster_sim.h"
#include "policy/cache_index.h"
#include "policy/policy.h"
#include "router/core/decision_log.h"
#include "router/core/peer_load.h"
#include "router/core/routing_core.h"
#include "worker/kv_events.h"

namespace kvf::experiments::sim {

enum class Ev : uint8_t {
  kArrival,         // a = request index: the client sends it (or queues it at max_in_flight)
  kRoute,           // a = request: the router receives it and decides
  kEngineArrive,    // a = request: the engine core queues it
  kStepEnd,         // a = engine, b = incarnation: the step in progress ends
  kFirstToken,      // a = request: the first token reaches the router and the client
  kFinish,          // a = request: the end of the stream reaches the router and the client
  kKvDeliver,       // a = engine: the oldest published KV batch reaches the cache index
  kHealthTick,      // a = engine: health check and /metrics scrape
  kEngineDown,      // a = engine
  kEngineUp,        // a = engine
  kTimeout,         // a = request: the client gives up
  kKvPushDone,      // b = push id: a KV push between two engines ends (link model)
  kPrefillDone,     // a = request: an offload's prefill answer (P's lease) reaches the router
  kReadTimeout,     // a = request: the router's upstream read deadline (no byte for read_timeout)
  kFaultStart,      // a = engine, b = index in sim.failures: a failure other than kDown begins
  kFaultEnd,        // a = engine, b = index in sim.failures: it ends
  kPrefillTimeout,  // a = request: the router gives up on an offload's P (prefill_timeout)
  kQueueTimeout,    // a = request: it has waited overload.max_wait in the router's queue
  kReplicaSync,     // every router replica publishes its load (sim.replicas.sync)
  kReplicaDeliver,  // b = message id: a replica's load message reaches its peers
  kOnboardReady,    // a = engine, b = incarnation: an onboard from its lower tiers may complete
};

struct Event {
  Nanos t = 0;
  uint64_t seq = 0;  // insertion order: ties at equal t keep it
  Ev kind = Ev::kArrival;
  uint32_t a = 0;
  uint64_t b = 0;
};

// A KV event as the simulated engine publishes it.
using SimKvEvent = worker::KvEvent;

// The engine's KV event sink (engine::KeyedKvEventSink: token-free stores too). Token-free
// engines hash with the index's own function (Sim::makeCore), so their hashes go to
// CacheIndex::storeOwnHashes as they are and no block key comes with a store.
class SimEventSink final : public engine::KeyedKvEventSink {
 public:
  bool wantsBlockKeys() const override { return false; }
  void onBlockStored(worker::BlockStored event) override { events_.emplace_back(std::move(event)); }
  void onBlockStoredKeys(worker::BlockStored event, std::vector<uint64_t>) override {
    events_.emplace_back(std::move(event));
  }
  void onBlockRemoved(worker::BlockRemoved event) override {
    events_.emplace_back(std::move(event));
  }
  void onAllBlocksCleared() override { events_.emplace_back(worker::AllBlocksCleared{}); }
  std::vector<SimKvEvent> take() { return std::exchange(events_, {}); }

 private:
  std::vector<SimKvEvent> events_;
};

struct EventLater {
  bool operator()(const Event& x, const Event& y) const {
    return x.t != y.t ? x.t > y.t : x.seq > y.seq;
  }
};

// A binary min-heap of events whose pop can be deferred: take() hands out the least event and
// leaves it in place, and the next push() overwrites it and sifts down once (a step end pops the
// engine's event and pushes its next step: one sift instead of a pop and a push). Any other
// access settles a taken top first, so the order is exactly std::priority_queue's.
class ReplaceTopHeap {
 public:
  bool empty() const { return heap_.size() == (taken_ ? 1u : 0u); }
  const Event& top() {
    settle();
    return heap_.front();
  }
  // The least event, removed from the heap (logically now, physically at the next call).
  Event take() {
    settle();
    taken_ = true;
    return heap_.front();
  }
  void push(const Event& e) {
    if (taken_) {
      taken_ = false;
      siftDown(0, e);
      return;
    }
    size_t hole = heap_.size();
    heap_.push_back(e);
    while (hole > 0) {
      size_t parent = (hole - 1) / 2;
      if (!EventLater()(heap_[parent], e)) break;
      heap_[hole] = heap_[parent];
      hole = parent;
    }
    heap_[hole] = e;
  }

 private:
  void settle() {
    if (!taken_) return;
    taken_ = false;
    Event last = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) siftDown(0, last);
  }
  // EventLater without branches: which child is less is a coin toss the predictor loses.
  static bool later(const Event& x, const Event& y) {
    return (x.t > y.t) | ((x.t == y.t) & (x.seq > y.seq));
  }
  // Places `e` at `hole` or below it, moving the lesser children up.
  void siftDown(size_t hole, const Event& e) {
    size_t n = heap_.size();
    for (size_t child = 2 * hole + 1; child < n; child = 2 * hole + 1) {
      if (child + 1 < n) child += static_cast<size_t>(later(heap_[child], heap_[child + 1]));
      if (!EventLater()(e, heap_[child])) break;
      heap_[hole] = heap_[child];
      hole = child;
    }
    heap_[hole] = e;
  }

  std::vector<Event> heap_;
  bool taken_ = false;
};

// The event queue: a binary heap plus FIFO lanes for kinds always scheduled a fixed delay after
// the current time (client timeouts, responses, KV deliveries, read deadlines, health ticks),
// which therefore arrive in (time, sequence) order and need no heap, and one for the sessions'
// first arrivals, pushed at start in trace order (at 1M requests 200,000 of them: in the heap
// every pop paid for its depth). Step ends (at most one pending per engine incarnation) have a
// heap of their own, a few levels deep and in L1, so the step end, the most frequent event,
// does not pay for the depth of the arrivals' heap. pop() takes the least (time, sequence) of
// the heap tops and the lane fronts, so the order is exactly a single heap's. An event that
// would break its lane's order (scheduled from a later time than now, a trace out of time
// order) goes to the heap.
class EventQueue {
 public:
  static constexpr int kHeap = -1;
  static constexpr int kEngineHeap = -2;  // step ends
  static constexpr int kLanes = 6;
  static constexpr int kStartLane = 4;   // events pushed before the run, in time order
  static constexpr int kHealthLane = 5;  // health ticks: a fixed interval after the last
  void push(const Event& e, int lane) {
    if (lane == kEngineHeap) {
      engine_heap_.push(e);
      return;
    }
    if (lane != kHeap) {
      std::deque<Event>& q = lanes_[static_cast<size_t>(lane)];
      if (q.empty() || !EventLater()(q.back(), e)) {
        q.push_back(e);
        return;
      }
    }
    heap_.push(e);
  }
  bool empty() const {
    if (!heap_.empty() || !engine_heap_.empty()) return false;
    for (const auto& q : lanes_) {
      if (!q.empty()) return false;
    }
    return true;
  }
  Event pop() {
    const Event* best = heap_.empty() ? nullptr : &heap_.top();
    int from = kHeap;
    if (!engine_heap_.empty() && (best == nullptr || EventLater()(*best, engine_heap_.top()))) {
      best = &engine_heap_.top();
      from = kEngineHeap;
    }
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (!lanes_[i].empty() && (best == nullptr || EventLater()(*best, lanes_[i].front()))) {
        best = &lanes_[i].front();
        from = static_cast<int>(i);
      }
    }
    Event e = *best;
    if (from == kHeap) {
      heap_.pop();
    } else if (from == kEngineHeap) {
      engine_heap_.take();
    } else {
      lanes_[static_cast<size_t>(from)].pop_front();
    }
    return e;
  }

 private:
  std::priority_queue<Event, std::vector<Event>, EventLater> heap_;
  ReplaceTopHeap engine_heap_;  // its popped top is overwritten by the next step end pushed
  std::array<std::deque<Event>, kLanes> lanes_;
};

// One request from the client's send to its result line.
struct Flight {
  uint32_t index = 0;
  Nanos sent = 0;
  std::vector<int32_t> prompt;       // until the engine has it (token mode)
  std::vector<uint64_t> block_keys;  // token-free mode: engine-block content keys
  uint64_t content_seed = 0;         // token-free mode: the prompt's key
  uint32_t replica = 0;              // the router replica the client sent it to
  // Router side: the request's routing in the core (prompt size, block hashes until the engine
  // has the prompt, attempts, decision, leases, exclusions).
  router::RequestRoute route;
  uint32_t incarnation = 0;  // of the attempt's engine
  Nanos decided_at = 0;
  bool in_engine = false;
  bool finishing = false;  // the last token left the engine
  int status = 0;
  // Client side.
  CompletionOutcome outcome;
  Nanos last_token = -1;
  Nanos last_byte = 0;  // when the router last received a byte of the engine's response
  // Prefill offload: the offload's one-token prefill runs on route.peer().
  bool prefill_phase = false;
  uint32_t peer_incarnation = 0;
  std::vector<worker::BlockHash> lease_hashes;
  std::string lease_id;
};

// A KV push in flight from `holder` to `dest` for request `id` (virtual time).
struct Push {
  int dest = 0, holder = 0;
  uint32_t dest_incarnation = 0, holder_incarnation = 0;
  std::string id;
  std::vector<worker::BlockHash> pinned;  // pinned on the holder, unpinned at the end
  size_t blocks = 0;                      // leading landing blocks the holder fills
  std::string lease_id;                   // released on the holder after the push (offload)
  Nanos started = 0;
};

// One engine instance: its core and the router's view of it.
struct SimEngine {
  // The sink must outlive the core that points to it.
  SimEventSink sink;
  std::unique_ptr<engine::EngineCore> core;
  bool up = true;
  uint32_t incarnation = 0;
  bool busy = false;
  Nanos onboard_wake = -1;                         // the pending kOnboardReady's time (-1: none)
  engine::StepResult current;                      // the step in progress
  std::deque<std::vector<SimKvEvent>> kv_batches;  // published, not yet applied
  // /metrics as last published by the engine (after each step and add).
  int64_t published_waiting = 0;
  double published_usage = 0;
  // Counters of earlier incarnations (a restarted engine starts from zero; totals are summed).
  engine::SchedulerStats previous;
  uint64_t finished = 0;
  // Injected failures in progress (sim.failures): answer every request with this status (0:
  // no), accept and never answer, refuse KV pushes.
  int error_status = 0;
  bool stalled = false;
  bool refuse_push = false;
};

class Sim {
 public:
  Sim(const ClusterSetup& setup, const std::vector<trace::Request>& requests);
  absl::Status init(const std::string& rep_dir);
  absl::StatusOr<SimStats> run();
  absl::Status writeMetrics(const std::string& rep_dir) const;

 private:
  friend class SimTestPeer;
  void push(Nanos t, Ev kind, uint32_t a, uint64_t b = 0);
  // The same into EventQueue::kStartLane (init: events already in time order).
  void pushAtStart(Nanos t, Ev kind, uint32_t a);
  void dispatch(const Event& e);
  // Engines with tiers: a wake-up when the earliest onboard is due (none while one is pending
  // earlier).
  void armOnboardWake(int instance, Nanos t);
  void onOnboardReady(int instance, uint64_t incarnation, Nanos t);

  // Client (cluster_sim.cc).
  void onArrival(uint32_t index, Nanos t);
  void send(uint32_t index, Nanos t);
  void promptKeys(Flight& f, const trace::Request& r);
  void complete(Flight& f, Nanos client_t);
  void failAtClient(Flight& f, Nanos client_t, int http_status, const std::string& error);
  void release(Flight& f, Nanos client_t);
  void onTimeout(uint32_t index, Nanos t);
  void onReadTimeout(uint32_t index, Nanos t);
  Nanos wallOfArrival(const trace::Request& r) const;

  // Router (sim_router.cc).
  void onRoute(uint32_t index, Nanos t);
  // Decides and sends a request admitted by the core's overload control.
  void routeAdmitted(uint32_t index, Nanos t);
  // Sends on every queued request the core lets go now (after an event that may free capacity).
  void drainQueue(Nanos t);
  void onQueueTimeout(uint32_t index, Nanos t);
  bool decide(Flight& f, Nanos t);
  void finishAttempt(Flight& f, Nanos t);
  void onFirstToken(uint32_t index, Nanos t);
  void onFinish(uint32_t index, Nanos t);
  void applyKv(int instance, std::vector<SimKvEvent>& batch);
  void applyKv(router::RoutingCore& core, int instance, const std::vector<SimKvEvent>& batch);
  router::RoutingCore& core(const Flight& f) { return *cores_[f.replica]; }

  // Router replicas' load exchange (sim_replicas.cc).
  void initReplicaSync();
  void onReplicaSync(Nanos t);
  void onReplicaDeliver(uint64_t message, Nanos t);

  // KV push and prefill offload (sim_transfer.cc).
  void startFetches(int instance, std::vector<engine::RemoteKvFetch>& fetches, Nanos t);
  void onKvPushDone(uint64_t push_id, Nanos t);
  void startPrefill(Flight& f, Nanos t);
  void onPrefillDone(uint32_t index, Nanos t);
  // P failed (`outcome`: a static string, as the live router logs it): D prefills locally.
  void prefillFailed(Flight& f, Nanos t, std::string_view outcome = "error");
  void sendToDecoder(Flight& f, Nanos t);
  void onPrefillArrive(Flight& f, Nanos t);
  void onPrefillTimeout(uint32_t index, Nanos t);

  // Engines (sim_engines.cc).
  absl::StatusOr<std::unique_ptr<engine::EngineCore>> makeCore(SimEngine& e);
  void onEngineArrive(uint32_t index, Nanos t);
  // The prompt part of a request spec for `f` (tokens or block keys); `keep` copies instead of
  // moving (an offload's prefill: the decoder needs the prompt too).
  void fillPrompt(Flight& f, engine::RequestSpec& spec, bool keep);
  void startStep(int instance, Nanos t);
  void onStepEnd(int instance, uint64_t incarnation, Nanos t);
  void publish(SimEngine& e);
  void onHealthTick(int instance, Nanos t);
  void onEngineDown(int instance, Nanos t);
  void onEngineUp(int instance, Nanos t);
  void onFault(int instance, const Failure& failure, bool start);
  Nanos engineTime(Nanos wall) const;
  Nanos wallDuration(Nanos engine_duration) const;

  Nanos ms(double v) const { return static_cast<Nanos>(v * 1e6); }

  const ClusterSetup& setup_;
  const std::vector<trace::Request>& requests_;
  EventQueue queue_;
  uint64_t next_seq_ = 0;
  Nanos now_ = 0;

  std::optional<trace::TokenSynthesizer> synth_;
  std::mt19937_64 jitter_rng_;
  std::vector<std::unique_ptr<Flight>> flights_;  // by request index; null when not in flight
  std::vector<std::string> instance_ids_;
  // Session dispatch: next request of the same session, or -1.
  std::vector<int64_t> next_in_session_;
  size_t next_arrival_ = 0;       // timestamp dispatch cursor
  std::deque<uint32_t> blocked_;  // waiting for a max_in_flight slot
  int64_t in_flight_ = 0;
  int64_t unfinished_ = 0;
  Nanos origin_ = 0;

  // One routing core per router replica (sim.replicas.count), each with its own ledger and
  // routed entries; every one indexes every engine's KV events.
  std::vector<std::unique_ptr<router::RoutingCore>> cores_;
  uint64_t next_replica_ = 0;
  std::vector<router::ReplicaLoadPublisher> publishers_;         // by replica (sync on)
  std::vector<router::PeerLoadTable> peer_tables_;               // by replica (sync on)
  std::map<uint64_t, router::ReplicaMessage> replica_messages_;  // in flight, by id
  uint64_t next_replica_message_ = 0;
  Nanos last_replica_snapshot_ = 0;
  std::vector<SimEngine> engines_;
  std::unique_ptr<router::DecisionLog> decisions_;
  std::FILE* results_ = nullptr;
  std::vector<char> results_buffer_;
  std::map<uint64_t, Push> pushes_;
  uint64_t next_push_ = 0;
  bool draining_queue_ = false;
  std::vector<uint32_t> step_flights_;  // onStepEnd: the flight index of each output
  std::string scratch_;
  SimStats stats_;
  absl::Status write_status_;

 public:
  ~Sim();
};

}  // namespace kvf::experiments::sim
