// The engine side of the simulator: engine::EngineCore instances stepped in virtual time the way
// engine/engine_server.cc's loop steps them (a step starts when the previous one ends, or at
// the arrival that wakes an idle engine), KV events published at step end, /metrics values as
// the health loop scrapes them, and injected failures (in-flight requests fail mid-stream; a
// restarted engine is cold and announces AllBlocksCleared).
#include <fmt/format.h>

#include "common/prefetch.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/accounted_tiers.h"
#include "experiments/sim/sim_internal.h"

namespace kvf::experiments::sim {
namespace {

// The keyed hasher the simulator gives its token-free engines: the cache index's own block-key
// hash (policy/block_hash.h), as an engine hash. Their hashes are then the index's by
// construction (CacheIndex::setEngineHashesAreOurs), so events need no mapping.
uint64_t engineKeyedHash(uint64_t parent, uint64_t key) {
  return policy::hashBlockKey(policy::BlockHash{parent}, key).value;
}

}  // namespace

absl::StatusOr<std::unique_ptr<engine::EngineCore>> Sim::makeCore(SimEngine& e) {
  engine::EngineConfig config = setup_.engine;
  config.scheduler.output_ids = false;  // outputs are found by their tag (the flight's index)
  // Tiers below the pool: the same rules as the live engine's, as block accounting (no bytes).
  auto tiers = [&]() -> std::unique_ptr<engine::LowerTiers> {
    if (!config.tiers) return nullptr;
    return std::make_unique<engine::AccountedTiers>(*config.tiers);
  };
  if (!setup_.sim.token_free) return engine::EngineCore::create(config, &e.sink, tiers());
  // Token-free engines hash blocks with the index's own function, so their BlockStored /
  // BlockRemoved hashes are the index's and it keeps no engine->ours map per instance (two
  // table probes fewer per block; Sim::init declares it to the index). Only the hash values
  // change: equal content still gets equal hashes, so the engines cache exactly as before.
  config.scheduler.keyed_hasher = {&engineKeyedHash, policy::kRootBlockHash.value};
  return engine::EngineCore::create(config, &e.sink, tiers());
}

Nanos Sim::engineTime(Nanos wall) const {
  if (setup_.engine_time_scale == 1.0) return wall;
  return static_cast<Nanos>(static_cast<double>(wall) * setup_.engine_time_scale);
}

Nanos Sim::wallDuration(Nanos engine_duration) const {
  if (setup_.engine_time_scale == 1.0) return engine_duration;
  return static_cast<Nanos>(static_cast<double>(engine_duration) / setup_.engine_time_scale);
}

void Sim::publish(SimEngine& e) {
  e.published_waiting = e.core->numWaiting();
  e.published_usage = e.core->pool().usage();
}

void Sim::fillPrompt(Flight& f, engine::RequestSpec& spec, bool keep) {
  std::vector<policy::BlockHash>& hashes = f.route.hashes;
  if (setup_.sim.token_free) {
    engine::PromptBlocks blocks;
    blocks.num_tokens = f.route.prompt_tokens;
    blocks.content_seed = f.content_seed;
    // The router hashed the same blocks with the engines' keyed hasher (makeCore) when its
    // block size is theirs: the engine takes those hashes (the one place where router hashes
    // become engine hashes) instead of hashing every block again. It appends its output
    // blocks' hashes to them: room for those too.
    const int64_t engine_bs = setup_.engine.cache.block_size;
    const bool same_blocks = static_cast<int64_t>(setup_.router.index.block_size) == engine_bs &&
                             hashes.size() == f.block_keys.size();
    if (same_blocks) {
      blocks.block_hashes.reserve(hashes.size() +
                                  static_cast<size_t>(f.route.max_tokens / engine_bs) + 1);
      for (policy::BlockHash h : hashes) blocks.block_hashes.emplace_back(h.value);
    }
    if (keep) {
      blocks.block_keys = f.block_keys;
    } else {
      blocks.block_keys = std::move(f.block_keys);
      f.block_keys = {};
      hashes = {};
    }
    spec.prompt_blocks = std::move(blocks);
    return;
  }
  if (!keep) hashes = {};
  spec.prompt.assign(f.prompt.begin(), f.prompt.end());
  if (!keep) f.prompt = {};
}

void Sim::onEngineArrive(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr) return;
  if (f->prefill_phase) {
    onPrefillArrive(*f, t);
    return;
  }
  const int instance = f->route.instance();
  SimEngine& e = engines_[instance];
  Nanos back = t + ms(setup_.sim.overheads.response_ms);
  if (!e.up || e.incarnation != f->incarnation) {
    f->status = 502;
    finishAttempt(*f, t);
    failAtClient(
        *f, back, 502,
        strCat("HTTP 502: upstream ", instance_ids_[instance], " failed: connection lost"));
    return;
  }
  if (e.error_status != 0) {  // an injected error: the engine answers it at once
    f->status = e.error_status;
    finishAttempt(*f, t);
    failAtClient(*f, back, e.error_status,
                 strCat("HTTP ", e.error_status, ": engine ", instance_ids_[instance], " error"));
    return;
  }
  if (e.stalled) {  // accepted (response headers), and never a byte more
    f->in_engine = true;
    f->last_byte = t;
    push(t + setup_.router.read_timeout, Ev::kReadTimeout, index);
    return;
  }
  engine::RequestSpec spec;
  spec.id = std::to_string(index);
  spec.tag = index;
  fillPrompt(*f, spec, false);
  spec.sampling.max_tokens = f->route.max_tokens;
  spec.sampling.min_tokens = f->route.max_tokens;
  spec.sampling.ignore_eos = true;
  const policy::Mode mode = f->route.decision().mode;
  const int peer = f->route.peer();
  if (mode != policy::Mode::kLocal && peer >= 0 && !f->lease_id.empty()) {
    spec.remote_kv = engine::RemoteKvSpec{std::to_string(peer), f->lease_hashes};
  } else if (mode == policy::Mode::kPushMigrate && peer >= 0) {
    spec.remote_kv = engine::RemoteKvSpec{std::to_string(peer), {}};
  }
  absl::Status valid = e.core->validate(spec);
  if (valid.ok()) valid = e.core->add(std::move(spec), engineTime(t));
  if (!valid.ok()) {  // the engine answers 400; the router passes it on
    f->status = 400;
    finishAttempt(*f, back);
    failAtClient(*f, back, 400, strCat("HTTP 400: ", std::string(valid.message())));
    return;
  }
  f->in_engine = true;
  f->last_byte = t;  // the engine answers with response headers at once
  push(t + setup_.router.read_timeout, Ev::kReadTimeout, index);
  publish(e);
  if (!e.busy) startStep(instance, t);
}

void Sim::startStep(int instance, Nanos t) {
  SimEngine& e = engines_[instance];
  engine::StepResult& result = e.current;  // its vectors' capacity is reused step after step
  e.core->step(engineTime(t), &result);
  if (!result.remote_kv_fetches.empty()) startFetches(instance, result.remote_kv_fetches, t);
  if (e.core->lowerTiers() != nullptr) armOnboardWake(instance, t);
  if (result.empty()) {
    e.busy = false;
    return;
  }
  ++stats_.steps;
  e.busy = true;
  Nanos end = t + wallDuration(result.duration) + ms(setup_.sim.overheads.step_overhead_ms);
  push(end, Ev::kStepEnd, static_cast<uint32_t>(instance), e.incarnation);
}

void Sim::armOnboardWake(int instance, Nanos t) {
  SimEngine& e = engines_[instance];
  std::optional<Nanos> ready = e.core->nextOnboardReady();
  if (!ready) return;
  Nanos wall = t + wallDuration(std::max<Nanos>(0, *ready - engineTime(t)));
  if (e.onboard_wake >= t && e.onboard_wake <= wall) return;  // an earlier wake-up covers it
  e.onboard_wake = wall;
  push(wall, Ev::kOnboardReady, static_cast<uint32_t>(instance), e.incarnation);
}

void Sim::onOnboardReady(int instance, uint64_t incarnation, Nanos t) {
  SimEngine& e = engines_[instance];
  if (!e.up || e.incarnation != incarnation) return;
  if (e.onboard_wake == t) e.onboard_wake = -1;
  // A running step's end steps again or re-arms (onStepEnd).
  if (!e.busy) startStep(instance, t);  // completes the due onboards, re-arms for later ones
}

void Sim::onStepEnd(int instance, uint64_t incarnation, Nanos t) {
  SimEngine& e = engines_[instance];
  if (!e.up || e.incarnation != incarnation) return;
  e.busy = false;
  Nanos client_t = t + ms(setup_.sim.overheads.response_ms);
  // Each output touches its flight and the flight's token gaps, one cache miss each at 1M
  // requests: bring them in for the whole batch first, so the misses overlap.
  step_flights_.clear();
  for (const engine::RequestOutput& out : e.current.outputs) {
    auto index = static_cast<uint32_t>(out.tag);
    step_flights_.push_back(index);
    if (index < flights_.size()) prefetchLine(&flights_[index]);
  }
  for (uint32_t index : step_flights_) {
    const Flight* f = index < flights_.size() ? flights_[index].get() : nullptr;
    if (f == nullptr) continue;
    prefetchLine(&f->in_engine);
    prefetchLine(&f->outcome.itl_s);
    prefetchLine(&f->last_token);
    prefetchLine(&f->prefill_phase);
    prefetchLine(f->outcome.itl_s.data() + f->outcome.itl_s.size());
  }
  for (size_t k = 0; k < step_flights_.size(); ++k) {
    engine::RequestOutput& out = e.current.outputs[k];
    uint32_t index = step_flights_[k];
    Flight* f = index < flights_.size() ? flights_[index].get() : nullptr;
    if (f != nullptr && f->prefill_phase && f->route.peer() == instance) {
      if (out.finish) {  // P answers with its lease (non-streaming)
        f->lease_id = out.lease_id.value_or("");
        f->lease_hashes = out.lease_block_hashes;
        push(client_t, Ev::kPrefillDone, index);
      }
      continue;
    }
    if (f == nullptr || !f->in_engine || f->route.instance() != instance) continue;
    CompletionOutcome& o = f->outcome;
    o.prompt_tokens = out.prompt_tokens;
    o.cached_tokens = out.cached_tokens;
    o.cpu_cached_tokens = out.tier_tokens - out.tier_disk_tokens;
    o.disk_cached_tokens = out.tier_disk_tokens;
    if (!out.new_tokens.empty()) {
      if (o.ttft_s < 0) {
        o.itl_s.reserve(static_cast<size_t>(f->route.max_tokens - 1));
        o.ttft_s = nanosToSeconds(client_t - f->sent);
        push(client_t, Ev::kFirstToken, index);
      } else {
        o.itl_s.push_back(nanosToSeconds(client_t - f->last_token));
      }
      f->last_token = client_t;
      f->last_byte = client_t;
      o.output_tokens += static_cast<int64_t>(out.new_tokens.size());
    }
    if (out.finish) {
      f->finishing = true;
      ++e.finished;
      push(client_t, Ev::kFinish, index);
    }
  }
  e.current.outputs.clear();
  std::vector<SimKvEvent> events = e.sink.take();
  if (engine::LowerTiers* tiers = e.core->lowerTiers()) engine::putTierEventsFirst(*tiers, events);
  if (!events.empty()) {
    e.kv_batches.push_back(std::move(events));
    push(t + ms(setup_.sim.overheads.kv_event_delay_ms), Ev::kKvDeliver,
         static_cast<uint32_t>(instance));
  }
  publish(e);
  if (e.core->hasWork()) {
    startStep(instance, t);
  } else if (e.core->lowerTiers() != nullptr) {
    armOnboardWake(instance, t);
  }
}

// The router's upstream read timeout (router/core/config.h read_timeout): no byte from the
// engine for that long ends the client's stream with an error, and the engine aborts the
// request. Under overload this is what fails requests whose first token takes longer.
void Sim::onReadTimeout(uint32_t index, Nanos t) {
  Flight* f = flights_[index].get();
  if (f == nullptr || !f->in_engine || f->finishing) return;
  Nanos deadline = f->last_byte + setup_.router.read_timeout;
  if (t < deadline) {
    push(deadline, Ev::kReadTimeout, index);
    return;
  }
  const int instance = f->route.instance();
  SimEngine& e = engines_[instance];
  if (e.up && e.incarnation == f->incarnation) {
    e.core->abort(std::to_string(index));
    publish(e);
  }
  f->in_engine = false;
  core(*f).upstreamFailure(instance, t);
  f->status = 502;
  finishAttempt(*f, t);
  failAtClient(*f, t + ms(setup_.sim.overheads.response_ms), 200,
               strCat("stream error: upstream ", instance_ids_[instance],
                      " failed mid-stream: no response byte for ",
                      nanosToSeconds(setup_.router.read_timeout), " s"));
}

void Sim::onHealthTick(int instance, Nanos t) {
  SimEngine& e = engines_[instance];
  const router::HealthConfig& h = setup_.router.health;
  // Each replica checks every engine itself.
  for (auto& core : cores_) {
    core->healthCheck(instance, e.up);
    if (e.up && h.scrape_metrics) {
      core->reportEngineLoad(instance, e.published_waiting, e.published_usage);
    }
  }
  drainQueue(t);
  if (unfinished_ > 0) push(t + h.interval, Ev::kHealthTick, static_cast<uint32_t>(instance));
}

void Sim::onEngineDown(int instance, Nanos t) {
  SimEngine& e = engines_[instance];
  if (!e.up) return;
  engine::SchedulerStats s = e.core->stats();
  e.previous.prefix_cache_queries += s.prefix_cache_queries;
  e.previous.prefix_cache_hits += s.prefix_cache_hits;
  e.previous.prompt_tokens += s.prompt_tokens;
  e.previous.generation_tokens += s.generation_tokens;
  e.previous.num_preemptions += s.num_preemptions;
  e.up = false;
  ++e.incarnation;
  e.busy = false;
  e.onboard_wake = -1;
  e.current = {};
  e.core.reset();
  e.sink.take();  // never published
  Nanos back = t + ms(setup_.sim.overheads.response_ms);
  for (auto& slot : flights_) {
    Flight* f = slot.get();
    if (f != nullptr && f->prefill_phase && f->route.peer() == instance) {
      core(*f).upstreamFailure(instance, t);
      prefillFailed(*f, t);  // D prefills locally
      continue;
    }
    if (f == nullptr || f->route.instance() != instance || !f->route.loadHeld() || f->finishing) {
      continue;
    }
    // Response headers are out: the router ends the client's stream with an error event.
    core(*f).upstreamFailure(instance, t);
    f->status = 502;
    f->in_engine = false;
    finishAttempt(*f, t);
    failAtClient(*f, back, 200,
                 strCat("stream error: upstream ", instance_ids_[instance], " failed mid-stream"));
  }
}

void Sim::onFault(int instance, const Failure& failure, bool start) {
  SimEngine& e = engines_[instance];
  switch (failure.kind) {
    case FailureKind::kError:
      e.error_status = start ? failure.status : 0;
      break;
    case FailureKind::kStall:
      e.stalled = start;
      break;
    case FailureKind::kRefusePush:
      e.refuse_push = start;
      break;
    case FailureKind::kDrain:
      for (auto& core : cores_) core->setDraining(instance, start);
      break;
    case FailureKind::kDown:
      break;  // onEngineDown / onEngineUp
  }
}

void Sim::onEngineUp(int instance, Nanos t) {
  SimEngine& e = engines_[instance];
  if (e.up) return;
  auto core = makeCore(e);
  if (!core.ok()) {
    write_status_ = core.status();
    return;
  }
  e.core = std::move(*core);
  e.up = true;
  e.published_waiting = 0;
  e.published_usage = 0;
  // A started engine publishes AllBlocksCleared first; the router resets its index entries.
  std::vector<SimKvEvent> cleared;
  cleared.emplace_back(worker::AllBlocksCleared{});
  e.kv_batches.push_back(std::move(cleared));
  push(t + ms(setup_.sim.overheads.kv_event_delay_ms), Ev::kKvDeliver,
       static_cast<uint32_t>(instance));
}

namespace {

absl::Status writeText(const std::string& path, const std::string& text) {
  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (!out) return absl::InternalError(strCat("cannot write ", path));
  bool ok = std::fwrite(text.data(), 1, text.size(), out) == text.size();
  ok = std::fclose(out) == 0 && ok;
  if (!ok) return absl::InternalError(strCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status Sim::writeMetrics(const std::string& rep_dir) const {
  const std::string& model = setup_.engine.served_model_name;
  for (size_t i = 0; i < engines_.size(); ++i) {
    const SimEngine& e = engines_[i];
    engine::SchedulerStats s = e.previous;
    if (e.core) {
      engine::SchedulerStats now = e.core->stats();
      s.prefix_cache_queries += now.prefix_cache_queries;
      s.prefix_cache_hits += now.prefix_cache_hits;
      s.prompt_tokens += now.prompt_tokens;
      s.generation_tokens += now.generation_tokens;
      s.num_preemptions += now.num_preemptions;
    }
    std::string text;
    auto metric = [&](const char* name, const char* type, const char* help, double v) {
      text += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{model_name=\"{}\"}} {}\n", name, help,
                          name, type, name, model, v);
    };
    metric("vllm:prefix_cache_queries_total", "counter",
           "Prompt tokens looked up in the prefix cache",
           static_cast<double>(s.prefix_cache_queries));
    metric("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache",
           static_cast<double>(s.prefix_cache_hits));
    metric("vllm:prompt_tokens_total", "counter", "Prompt tokens of admitted requests",
           static_cast<double>(s.prompt_tokens));
    metric("vllm:generation_tokens_total", "counter", "Generated tokens",
           static_cast<double>(s.generation_tokens));
    metric("vllm:num_preemptions_total", "counter", "Preemptions (recompute)",
           static_cast<double>(s.num_preemptions));
    metric("vllm:request_success_total", "counter", "Finished requests",
           static_cast<double>(e.finished));
    if (e.core && e.core->lowerTiers() != nullptr) {
      // Queued-time prefetch of the engine's current incarnation (docs/tiers.md).
      const engine::PrefetchStats p = e.core->stats().prefetch;
      metric("kvfabric_engine_prefetch_promoted_blocks_total", "counter",
             "Disk blocks of waiting requests whose promotion started",
             static_cast<double>(p.promoted));
      metric("kvfabric_engine_prefetch_used_blocks_total", "counter",
             "Promoted blocks onboarded from host memory", static_cast<double>(p.used));
      metric("kvfabric_engine_prefetch_late_blocks_total", "counter",
             "Promoted blocks read from disk at admission", static_cast<double>(p.late));
      metric("kvfabric_engine_prefetch_wasted_blocks_total", "counter",
             "Promotions no admitted request used", static_cast<double>(p.wasted));
      for (size_t r = 0; r < engine::kPrefetchSkipCount; ++r) {
        const std::string name =
            fmt::format("kvfabric_engine_prefetch_skipped_{}_blocks_total",
                        engine::prefetchSkipName(static_cast<engine::PrefetchSkip>(r)));
        metric(name.c_str(), "counter", "Disk blocks of waiting requests not promoted",
               static_cast<double>(p.skipped[r]));
      }
    }
    KVF_RETURN_IF_ERROR(writeText(fmt::format("{}/engine_{}.metrics", rep_dir, i), text));
  }
  if (setup_.router.overload.enabled) {
    KVF_RETURN_IF_ERROR(writeText(rep_dir + "/router.metrics",
                                  cores_[0]->overloadStats().prometheusText(
                                      cores_[0]->queueDepth())));  // the first replica's
  }
  return absl::OkStatus();
}

}  // namespace kvf::experiments::sim
