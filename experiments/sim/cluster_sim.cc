// The event loop and the client side of the simulator: dispatch by trace timestamp or by
// session, prompt synthesis, timeouts, max_in_flight, and the per-request result lines.
#include "experiments/sim/cluster_sim.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "experiments/sim/sim_internal.h"
#include "policy/block_hash.h"

namespace kvf::experiments::sim {

Sim::Sim(const ClusterSetup& setup, const std::vector<trace::Request>& requests)
    : setup_(setup),
      requests_(requests),
      jitter_rng_(setup.seed),
      flights_(requests.size()),
      engines_(static_cast<size_t>(setup.engines)) {}

Sim::~Sim() {
  if (results_) std::fclose(results_);
}

void Sim::push(Nanos t, Ev kind, uint32_t a, uint64_t b) {
  // Lanes: kinds always pushed at now + a fixed delay (see EventQueue).
  int lane = EventQueue::kHeap;
  switch (kind) {
    case Ev::kTimeout:
      lane = 0;
      break;
    case Ev::kFirstToken:
    case Ev::kFinish:
    case Ev::kPrefillDone:
      lane = 1;
      break;
    case Ev::kKvDeliver:
      lane = 2;
      break;
    case Ev::kReadTimeout:  // now + read_timeout, or an earlier deadline (then the heap)
      lane = 3;
      break;
    case Ev::kHealthTick:  // every engine's first at the same time, then now + interval
      lane = EventQueue::kHealthLane;
      break;
    case Ev::kStepEnd:  // at most one pending per engine incarnation
      lane = EventQueue::kEngineHeap;
      break;
    default:
      break;
  }
  queue_.push(Event{t, next_seq_++, kind, a, b}, lane);
}

void Sim::pushAtStart(Nanos t, Ev kind, uint32_t a) {
  queue_.push(Event{t, next_seq_++, kind, a, 0}, EventQueue::kStartLane);
}

absl::Status Sim::init(const std::string& rep_dir) {
  KVF_ASSIGN_OR_RETURN(trace::TokenSynthesizer synth,
                       trace::TokenSynthesizer::create(setup_.synth));
  synth_.emplace(std::move(synth));
  for (int r = 0; r < setup_.sim.replicas.count; ++r) {
    KVF_ASSIGN_OR_RETURN(auto core, router::RoutingCore::create(setup_.router));
    cores_.push_back(std::move(core));
  }
  for (int i = 0; i < setup_.engines; ++i) {
    instance_ids_.push_back(std::to_string(i));
    KVF_ASSIGN_OR_RETURN(engines_[i].core, makeCore(engines_[i]));
    for (auto& core : cores_) {
      // Every simulated engine publishes KV events; cluster.workers gives each one a worker.
      core->addInstance(i, instance_ids_.back(), setup_.workers, true);
      if (setup_.sim.token_free) core->index().setEngineHashesAreOurs(i, true);  // see makeCore
    }
  }
  initReplicaSync();
  if (setup_.sim.decision_log) {
    KVF_ASSIGN_OR_RETURN(decisions_, router::DecisionLog::open(rep_dir + "/decisions.jsonl", 1));
  }
  std::string path = rep_dir + "/results.jsonl";
  if (std::filesystem::exists(path)) {
    return absl::AlreadyExistsError(strCat(path, " exists; never overwriting results"));
  }
  results_ = std::fopen(path.c_str(), "wb");
  if (!results_) return absl::InternalError(strCat("cannot open ", path));
  results_buffer_.resize(1 << 20);
  std::setvbuf(results_, results_buffer_.data(), _IOFBF, results_buffer_.size());

  unfinished_ = static_cast<int64_t>(requests_.size());
  origin_ = requests_.empty() ? 0 : requests_.front().arrival;
  if (setup_.replay.dispatch == DispatchMode::kTimestamp) {
    if (!requests_.empty()) push(wallOfArrival(requests_[0]), Ev::kArrival, 0);
    next_arrival_ = 1;
  } else {
    // Sessions in order of first appearance; each turn waits for the previous one.
    next_in_session_.assign(requests_.size(), -1);
    std::map<std::string, uint32_t> last;
    for (uint32_t i = 0; i < requests_.size(); ++i) {
      const trace::Request& r = requests_[i];
      std::string key = r.session_id.empty() ? "#" + r.id : r.session_id;
      auto [it, inserted] = last.try_emplace(key, i);
      if (inserted) {
        pushAtStart(wallOfArrival(r), Ev::kArrival, i);
      } else {
        next_in_session_[it->second] = i;
        it->second = i;
      }
    }
  }
  Nanos interval = setup_.router.health.interval;
  for (uint32_t i = 0; i < engines_.size(); ++i) push(interval, Ev::kHealthTick, i);
  for (size_t k = 0; k < setup_.sim.failures.size(); ++k) {
    const Failure& f = setup_.sim.failures[k];
    if (f.instance >= setup_.engines) {
      return absl::InvalidArgumentError(strCat("sim.failures: instance ", f.instance,
                                               " does not exist (", setup_.engines, " engines)"));
    }
    const auto i = static_cast<uint32_t>(f.instance);
    if (f.kind == FailureKind::kDown) {
      push(f.at, Ev::kEngineDown, i);
      if (f.down_for > 0) push(f.at + f.down_for, Ev::kEngineUp, i);
      continue;
    }
    push(f.at, Ev::kFaultStart, i, k);
    if (f.down_for > 0) push(f.at + f.down_for, Ev::kFaultEnd, i, k);
  }
  return absl::OkStatus();
}

Nanos Sim::wallOfArrival(const trace::Request& r) const {
  double scaled = static_cast<double>(r.arrival - origin_) / setup_.replay.time_scale;
  return static_cast<Nanos>(scaled);
}

void Sim::dispatch(const Event& e) {
  switch (e.kind) {
    case Ev::kArrival:
      onArrival(e.a, e.t);
      break;
    case Ev::kRoute:
      onRoute(e.a, e.t);
      break;
    case Ev::kEngineArrive:
      onEngineArrive(e.a, e.t);
      break;
    case Ev::kStepEnd:
      onStepEnd(static_cast<int>(e.a), e.b, e.t);
      break;
    case Ev::kOnboardReady:
      onOnboardReady(static_cast<int>(e.a), e.b, e.t);
      break;
    case Ev::kFirstToken:
      onFirstToken(e.a, e.t);
      break;
    case Ev::kFinish:
      onFinish(e.a, e.t);
      break;
    case Ev::kKvDeliver: {
      SimEngine& eng = engines_[e.a];
      if (!eng.kv_batches.empty()) {
        applyKv(static_cast<int>(e.a), eng.kv_batches.front());
        eng.kv_batches.pop_front();
      }
      break;
    }
    case Ev::kHealthTick:
      onHealthTick(static_cast<int>(e.a), e.t);
      break;
    case Ev::kEngineDown:
      onEngineDown(static_cast<int>(e.a), e.t);
      break;
    case Ev::kEngineUp:
      onEngineUp(static_cast<int>(e.a), e.t);
      break;
    case Ev::kTimeout:
      onTimeout(e.a, e.t);
      break;
    case Ev::kKvPushDone:
      onKvPushDone(e.b, e.t);
      break;
    case Ev::kPrefillDone:
      onPrefillDone(e.a, e.t);
      break;
    case Ev::kReadTimeout:
      onReadTimeout(e.a, e.t);
      break;
    case Ev::kFaultStart:
    case Ev::kFaultEnd:
      onFault(static_cast<int>(e.a), setup_.sim.failures[e.b], e.kind == Ev::kFaultStart);
      break;
    case Ev::kPrefillTimeout:
      onPrefillTimeout(e.a, e.t);
      break;
    case Ev::kQueueTimeout:
      onQueueTimeout(e.a, e.t);
      break;
    case Ev::kReplicaSync:
      onReplicaSync(e.t);
      break;
    case Ev::kReplicaDeliver:
      onReplicaDeliver(e.b, e.t);
      break;
  }
}

absl::StatusOr<SimStats> Sim::run() {
  // Progress goes to the log every 10 s of wall time; results never see the wall clock.
  auto last_progress = std::chrono::steady_clock::now();
  while (!queue_.empty()) {
    Event e = queue_.pop();
    now_ = e.t;
    ++stats_.events;
    dispatch(e);
    if (!write_status_.ok()) return write_status_;
    if ((stats_.events & 0xFFFF) == 0 &&
        std::chrono::steady_clock::now() - last_progress > std::chrono::seconds(10)) {
      last_progress = std::chrono::steady_clock::now();
      log::info("simulating", "arm", setup_.label, "done",
                strCat(requests_.size() - static_cast<size_t>(unfinished_), "/", requests_.size()),
                "in_flight", in_flight_, "virtual_s", nanosToSeconds(now_));
    }
  }
  if (unfinished_ != 0) {
    return absl::InternalError(strCat(unfinished_, " requests never finished (simulator bug)"));
  }
  if (std::fflush(results_) != 0) return absl::InternalError("writing results.jsonl");
  return stats_;
}

void Sim::onArrival(uint32_t index, Nanos t) {
  if (setup_.replay.dispatch == DispatchMode::kTimestamp && next_arrival_ < requests_.size()) {
    push(wallOfArrival(requests_[next_arrival_]), Ev::kArrival,
         static_cast<uint32_t>(next_arrival_));
    ++next_arrival_;
  }
  if (setup_.replay.max_in_flight > 0 && in_flight_ >= setup_.replay.max_in_flight) {
    blocked_.push_back(index);
    return;
  }
  send(index, t);
}

void Sim::send(uint32_t index, Nanos t) {
  const trace::Request& r = requests_[index];
  auto f = std::make_unique<Flight>();
  f->index = index;
  f->sent = t;
  // Client-side round robin over the router replicas, in send order.
  f->replica = static_cast<uint32_t>(next_replica_++ % cores_.size());
  router::RequestRoute& route = f->route;
  route.session = r.session_id;
  route.max_tokens = std::max<int64_t>(r.output_length, 1);
  if (setup_.sim.token_free) {
    promptKeys(*f, r);
  } else {
    synth_->appendPrompt(r, index, &f->prompt);
    route.prompt_tokens = static_cast<int64_t>(f->prompt.size());
    std::span<const uint32_t> tokens(reinterpret_cast<const uint32_t*>(f->prompt.data()),
                                     f->prompt.size());
    policy::hashTokenBlocks(tokens, setup_.router.index.block_size, &route.hashes);
  }
  route.hashes_complete = true;
  const Overheads& o = setup_.sim.overheads;
  double latency_ms =
      o.request_ms + o.request_per_ktoken_ms * static_cast<double>(route.prompt_tokens) / 1000.0;
  if (o.jitter_ms > 0) {
    latency_ms += std::uniform_real_distribution<double>(0.0, o.jitter_ms)(jitter_rng_);
  }
  ++in_flight_;
  ++stats_.requests;
  push(t + ms(latency_ms), Ev::kRoute, index);
  auto timeout_ns = static_cast<Nanos>(setup_.replay.timeout.count()) * kNanosPerMilli;
  push(t + timeout_ns, Ev::kTimeout, index);
  flights_[index] = std::move(f);
}

// Token-free prompt: the engine's block keys and the router's hashes from the trace's ids (the
// router's own keys when its block size differs from the engine's).
void Sim::promptKeys(Flight& f, const trace::Request& r) {
  router::RequestRoute& route = f.route;
  route.prompt_tokens = std::max<int64_t>(r.input_length, 0);
  const int64_t engine_bs = setup_.engine.cache.block_size;
  const auto router_bs = static_cast<int64_t>(setup_.router.index.block_size);
  f.content_seed = synth_->appendBlockKeys(r, f.index, engine_bs, &f.block_keys);
  if (router_bs == engine_bs) {
    route.hashes.reserve(f.block_keys.size());
    policy::hashKeyBlocks(f.block_keys, &route.hashes);
  } else if (router_bs > 0) {
    std::vector<uint64_t> keys;
    synth_->appendBlockKeys(r, f.index, router_bs, &keys);
    policy::hashKeyBlocks(keys, &route.hashes);
  }
}

void Sim::onTimeout(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr) return;
  core(*f).cancelQueued(index);  // the client left while its request waited in the router
  // The client closes the stream: the router stops forwarding and the engine aborts the request.
  if (f->in_engine) {
    SimEngine& e = engines_[f->route.instance()];
    if (e.up && e.incarnation == f->incarnation) {
      e.core->abort(std::to_string(index));
      publish(e);
    }
    f->in_engine = false;
  }
  if (f->route.loadHeld()) finishAttempt(*f, t);
  failAtClient(*f, t, f->outcome.http_status,
               strCat("timed out after ", setup_.replay.timeout.count(), " ms"));
}

void Sim::failAtClient(Flight& f, Nanos client_t, int http_status, const std::string& error) {
  f.outcome.ok = false;
  f.outcome.http_status = http_status;
  f.outcome.error = error;
  f.outcome.e2e_s = -1;
  f.outcome.tpot_s = -1;
  ++stats_.errors;
  release(f, client_t);
}

void Sim::complete(Flight& f, Nanos client_t) {
  CompletionOutcome& o = f.outcome;
  o.ok = true;
  o.http_status = 200;
  o.e2e_s = nanosToSeconds(client_t - f.sent);
  if (o.output_tokens >= 2) {
    o.tpot_s = (o.e2e_s - o.ttft_s) / static_cast<double>(o.output_tokens - 1);
  }
  release(f, client_t);
}

// Writes the result line and frees the client's slot; a session's next turn follows.
void Sim::release(Flight& f, Nanos client_t) {
  uint32_t index = f.index;
  const trace::Request& r = requests_[index];
  RequestResult result;
  result.request_id = r.id;
  result.session_id = r.session_id;
  result.turn = r.turn;
  result.arrival_s = nanosToSeconds(r.arrival);
  result.sent_s = nanosToSeconds(f.sent);
  result.input_length = r.input_length;
  result.output_length = r.output_length;
  result.outcome = std::move(f.outcome);
  scratch_ = result.toJsonLine();
  scratch_.push_back('\n');
  if (std::fwrite(scratch_.data(), 1, scratch_.size(), results_) != scratch_.size() &&
      write_status_.ok()) {
    write_status_ = absl::InternalError("writing results.jsonl");
  }
  flights_[index].reset();
  --in_flight_;
  if (--unfinished_ == 0) stats_.virtual_seconds = nanosToSeconds(client_t);
  if (!next_in_session_.empty() && next_in_session_[index] >= 0) {
    auto next = static_cast<uint32_t>(next_in_session_[index]);
    const trace::Request& n = requests_[next];
    Nanos think = n.think_time > 0 ? n.think_time : 0;
    Nanos at = std::max(wallOfArrival(n), client_t + static_cast<Nanos>(static_cast<double>(think) /
                                                                        setup_.replay.time_scale));
    push(std::max(at, client_t), Ev::kArrival, next);
  }
  if (!blocked_.empty() && in_flight_ < setup_.replay.max_in_flight) {
    uint32_t next = blocked_.front();
    blocked_.pop_front();
    send(next, client_t);
  }
}

absl::StatusOr<SimStats> simulate(const ClusterSetup& setup,
                                  const std::vector<trace::Request>& requests,
                                  const std::string& rep_dir) {
  Sim sim(setup, requests);
  KVF_RETURN_IF_ERROR(sim.init(rep_dir));
  KVF_ASSIGN_OR_RETURN(SimStats stats, sim.run());
  KVF_RETURN_IF_ERROR(sim.writeMetrics(rep_dir));
  return stats;
}

}  // namespace kvf::experiments::sim
