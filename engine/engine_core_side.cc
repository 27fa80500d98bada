// The core thread of the live engine: the step loop on absolute deadlines, the stats snapshot,
// and the worker::EngineAdapter the agent reaches the core through (pins, landing blocks, the
// end of a fetch). What a remote fetch costs here is the emulator's own: the transfer takes at
// least its modelled link time, and the landed bytes must be the content of their hashes.
#include <algorithm>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/engine_server_impl.h"
#if KVF_WITH_CUDA
#include "engine/device_tiers.h"
#endif
#include "worker/block_payload.h"

namespace kvf::engine {

using detail::kAwait;
using detail::Steady;
using detail::steadyNanos;
using detail::toTimePoint;
using detail::unixSeconds;

namespace {
// How often an idle engine publishes its tiers' events.
constexpr auto kTierEventInterval = std::chrono::milliseconds(50);
}  // namespace

EngineCoreSide::EngineCoreSide(EngineShared& shared)
    : shared_(shared), work_(asio::make_work_guard(ioc_)), step_timer_(ioc_), wake_timer_(ioc_) {}

absl::Status EngineCoreSide::createCore() {
  const EngineConfig& config = shared_.config;
  KVF_RETURN_IF_ERROR(checkPayloadMemory(config));
  if (config.cache.payload_memory == PayloadLocation::kDevice) return createDeviceCore();
  std::unique_ptr<LiveTiers> tiers;
  if (config.tiers) {
    KVF_ASSIGN_OR_RETURN(tiers, LiveTiers::create(liveTiersOptions(config)));
    exportTiers(*tiers);
  }
  KVF_ASSIGN_OR_RETURN(core_, EngineCore::create(config, &step_events_, std::move(tiers)));
  return absl::OkStatus();
}

LiveTiersOptions EngineCoreSide::liveTiersOptions(const EngineConfig& config) {
  LiveTiersOptions options;
  options.store = *config.tiers;
  options.block_size = config.cache.block_size;
  return options;
}

void EngineCoreSide::exportTiers(LiveTiers& tiers) {
  tiers_ = &tiers;
  worker::exportMetrics(tiers_->store(), shared_.registry);
  tier_push_ = std::make_unique<worker::TierPushSource>(tiers_->store());
}

absl::Status EngineCoreSide::createDeviceCore() {
#if KVF_WITH_CUDA
  const EngineConfig& config = shared_.config;
  const size_t block_bytes = config.cache.payload_bytes_per_block;
  KVF_ASSIGN_OR_RETURN(
      std::shared_ptr<DevicePayload> memory,
      DevicePayload::create(block_bytes * static_cast<size_t>(config.cache.num_gpu_blocks),
                            block_bytes));
  std::unique_ptr<DeviceTiers> tiers;
  if (config.tiers) {
    DeviceTiersOptions options;
    options.live = liveTiersOptions(config);
    KVF_ASSIGN_OR_RETURN(tiers, DeviceTiers::create(std::move(options), memory));
    exportTiers(tiers->live());
  }
  KVF_ASSIGN_OR_RETURN(core_, EngineCore::create(config, &step_events_, std::move(tiers), memory));
  log::info("KV pool in device memory", "blocks", config.cache.num_gpu_blocks, "block_bytes",
            block_bytes, "tiers", config.tiers.has_value());
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      "cache.payload_memory: device needs a build with CUDA (this one has none)");
#endif
}

void EngineCoreSide::connect(EngineHttpSide* http, worker::KvEventPublisher* publisher,
                             worker::WorkerAgent* agent) {
  http_ = http;
  publisher_ = publisher;
  agent_ = agent;
}

void EngineCoreSide::start() {
  asio::co_spawn(ioc_, stepLoop(), asio::detached);
  thread_ = std::thread([this] { ioc_.run(); });
}

void EngineCoreSide::shutdown() {
  if (!thread_.joinable()) return;
  asio::post(ioc_, [this] {
    stopping_ = true;
    step_timer_.cancel();
    wake_timer_.cancel();
  });
  work_.reset();
  ioc_.stop();
  thread_.join();
}

void EngineCoreSide::add(RequestSpec spec, Nanos arrival, std::shared_ptr<detail::Pending> p) {
  asio::post(ioc_, [this, spec = std::move(spec), arrival, p]() mutable {
    absl::Status added = core_->add(std::move(spec), arrival);
    if (!added.ok()) {
      // validate() accepted it, so this is a bug; answer instead of hanging the client.
      log::error("engine core rejected a validated request", "error", std::string(added.message()));
      asio::post(p->signal.get_executor(), [p] {
        p->done = true;
        p->finish_reason = "abort";
        p->signal.cancel();
      });
      return;
    }
    afterChange();
  });
}

void EngineCoreSide::abort(const std::string& id) {
  asio::post(ioc_, [this, id] {
    // A step finishes its requests when it starts and answers when it ends: a remote-decode
    // request aborted in between has already handed its lease (named by its id) to the agent,
    // and its client, who alone could pass the lease on, is gone.
    if (!core_->abort(id)) {
      core_->releaseLease(id);
      if (agent_ != nullptr) agent_->releaseLease(id);
    }
    publishStats();
  });
}

asio::awaitable<bool> EngineCoreSide::resetPrefixCache() {
  auto reset = [this]() -> asio::awaitable<bool> {
    bool ok = core_->pool().resetPrefixCache();
    publishEvents();
    publishStats();
    co_return ok;
  };
  co_return co_await asio::co_spawn(ioc_, reset, asio::use_awaitable);
}

asio::awaitable<KvPool::PayloadAudit> EngineCoreSide::auditPayloads() {
  auto audit = [this]() -> asio::awaitable<KvPool::PayloadAudit> {
    co_return core_->pool().auditPayloads();
  };
  co_return co_await asio::co_spawn(ioc_, audit, asio::use_awaitable);
}

double EngineCoreSide::latenessQuantile(double q) const {
  if (recent_lateness_.empty()) return 0;
  std::vector<double> v(recent_lateness_.begin(), recent_lateness_.end());
  auto k = static_cast<size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

void EngineCoreSide::publishEvents() {
  std::vector<worker::KvEvent> events = step_events_.take();
  // The core's tiers (a device pool's wrap the store's): their takeEvents retires copies first.
  if (LowerTiers* tiers = core_->lowerTiers()) putTierEventsFirst(*tiers, events);
  if (publisher_ != nullptr && !events.empty())
    publisher_->publish(std::move(events), unixSeconds());
}

asio::awaitable<void> EngineCoreSide::stepLoop() {
  EngineShared::Metrics& m = shared_.m;
  Nanos next_wall = steadyNanos();
  while (!stopping_) {
    // Requests waiting for onboards from the lower tiers need a step once those are ready.
    std::optional<Nanos> onboard = core_->nextOnboardReady();
    const bool onboard_due = onboard && *onboard <= shared_.engineNow(steadyNanos());
    if (!core_->hasWork() && !onboard_due) {
      idle_ = true;
      Steady::time_point wake = Steady::time_point::max();
      if (onboard) wake = toTimePoint(shared_.wallFor(*onboard));
      // The tiers' own events (disk writes finishing, the start report) go out while idle too.
      if (tiers_ != nullptr) wake = std::min(wake, Steady::now() + kTierEventInterval);
      wake_timer_.expires_at(wake);
      co_await wake_timer_.async_wait(kAwait);
      idle_ = false;
      if (tiers_ != nullptr) publishEvents();
      next_wall = steadyNanos();  // an idle engine starts its next step at the arrival
      continue;
    }
    if (onboard_due) next_wall = std::max(next_wall, steadyNanos());
    StepResult result = core_->step(shared_.engineNow(next_wall));
    // The leases of requests finished in this step are still pinned and nothing has run since:
    // the agent takes them over before any later step could evict their blocks.
    handOverLeases(result);
    if (!result.remote_kv_fetches.empty()) {
      publishStats();
      const Nanos started = steadyNanos();
      for (const RemoteKvFetch& f : result.remote_kv_fetches) {
        fetches_[f.id] = detail::FetchRecord{f.hashes, f.blocks, started};
      }
      asio::post(http_->executor(),
                 [http = http_, fetches = std::move(result.remote_kv_fetches)]() mutable {
                   for (auto& f : fetches) http->startFetch(std::move(f));
                 });
    }
    if (result.empty()) {
      next_wall = steadyNanos();
      continue;
    }
    Nanos end_wall = shared_.wallFor(result.start + result.duration);
    step_timer_.expires_at(toTimePoint(end_wall));
    co_await step_timer_.async_wait(kAwait);
    if (stopping_) break;
    Nanos now = steadyNanos();
    double late = nanosToSeconds(std::max<Nanos>(0, now - end_wall));
    m.lateness->observe(late);
    recent_lateness_.push_back(late);
    if (recent_lateness_.size() > 65536) recent_lateness_.pop_front();
    m.steps->inc();
    m.step_seconds->observe(nanosToSeconds(result.duration));
    publishEvents();
    if (static_cast<uint64_t>(m.steps->value()) % 128 == 0) {
      shared_.snapshot.lateness_p99.store(latenessQuantile(0.99));
    }
    publishStats();
    asio::post(http_->executor(),
               [http = http_, outputs = std::move(result.outputs),
                end = result.start + result.duration]() { http->deliver(outputs, end); });
    next_wall = end_wall;  // absolute deadlines: lateness does not accumulate
    if (now - last_progress_log_ > 10 * kNanosPerSecond) {
      last_progress_log_ = now;
      auto s = core_->stats();
      log::info("engine progress", "running", s.num_running, "waiting", s.num_waiting, "kv_usage",
                core_->pool().usage(), "steps", m.steps->value(), "lateness_p99_ms",
                latenessQuantile(0.99) * 1e3);
    }
  }
}

void EngineCoreSide::handOverLeases(const StepResult& result) {
  if (agent_ == nullptr) return;
  for (const RequestOutput& out : result.outputs) {
    if (!out.lease_id) continue;
    if (std::optional<worker::Lease> lease = core_->detachLease(*out.lease_id)) {
      agent_->adoptLease(*out.lease_id, std::move(*lease));
    }
  }
}

void EngineCoreSide::afterChange() {
  publishStats();
  if (idle_) wake_timer_.cancel();
}

void EngineCoreSide::publishStats() {
  SchedulerStats st = core_->stats();
  EngineShared::StatsSnapshot& s = shared_.snapshot;
  s.running.store(st.num_running);
  s.waiting.store(st.num_waiting);
  s.usage.store(core_->pool().usage());
  s.queries.store(static_cast<double>(st.prefix_cache_queries));
  s.hits.store(static_cast<double>(st.prefix_cache_hits));
  s.prompt.store(static_cast<double>(st.prompt_tokens));
  s.generation.store(static_cast<double>(st.generation_tokens));
  s.preemptions.store(static_cast<double>(st.num_preemptions));
  s.waiting_remote.store(st.num_waiting_for_remote_kv);
  s.quarantined.store(static_cast<double>(st.remote_kv_blocks_quarantined));
  const PrefetchStats& p = st.prefetch;
  const uint64_t counts[] = {p.promoted, p.used, p.late, p.wasted, p.touched};
  for (size_t i = 0; i < std::size(counts); ++i)
    s.prefetch[i].store(static_cast<double>(counts[i]));
  for (size_t i = 0; i < kPrefetchSkipCount; ++i) {
    s.prefetch[std::size(counts) + i].store(static_cast<double>(p.skipped[i]));
  }
}

// ---- worker::EngineAdapter ----

worker::BlockGeometry EngineCoreSide::geometry() const {
  const CacheConfig& c = shared_.config.cache;
  return {c.block_size, c.payload_bytes_per_block, static_cast<uint64_t>(c.num_gpu_blocks)};
}

worker::PayloadRegion EngineCoreSide::payloadRegion() const {
  std::span<std::byte> region = core_->pool().payloadRegion();
  return {region.data(), region.size()};
}

Nanos EngineCoreSide::now() const { return shared_.engineNow(steadyNanos()); }

void EngineCoreSide::post(absl::AnyInvocable<void() &&> fn) {
  asio::post(ioc_, [fn = std::move(fn)]() mutable { std::move(fn)(); });
}

std::vector<BlockIndex> EngineCoreSide::pinLeadingRun(std::span<const BlockHash> hashes) {
  return core_->pinLeadingRun(hashes);
}

void EngineCoreSide::unpin(std::span<const BlockHash> hashes) {
  core_->unpin(hashes);
  publishStats();
}

worker::PayloadRegion EngineCoreSide::tierRegion() const {
  return tier_push_ != nullptr ? tier_push_->region() : worker::PayloadRegion{};
}

worker::TierPushRun EngineCoreSide::pinTierRun(std::span<const BlockHash> hashes,
                                               std::span<const std::span<std::byte>> disk_buffers,
                                               absl::AnyInvocable<void(size_t) &&> on_disk_read) {
  if (tier_push_ == nullptr) {
    return EngineAdapter::pinTierRun(hashes, disk_buffers, std::move(on_disk_read));
  }
  return tier_push_->pin(hashes, disk_buffers, std::move(on_disk_read));
}

void EngineCoreSide::unpinTierRun(uint64_t id) {
  if (tier_push_ != nullptr) tier_push_->unpin(id);
}

void EngineCoreSide::completeRemoteKv(const worker::RemoteKvOutcome& outcome) {
  const int64_t bs = shared_.config.cache.block_size;
  // The modelled link: the push costs max(real transport time, modelled time).
  const Nanos modelled = shared_.wallDuration(
      core_->timing().transferDuration(static_cast<int64_t>(outcome.landed) * bs));
  const Nanos started = steadyNanos() - outcome.elapsed;
  if (shared_.config.worker.layerwise) {
    // The KV is usable layer by layer: the first step overlaps the transfer (engine_core.h).
    settleFetch(outcome, shared_.engineNow(started + modelled));
    return;
  }
  if (modelled <= outcome.elapsed) {
    settleFetch(outcome, -1);
    return;
  }
  auto link = std::make_shared<asio::steady_timer>(ioc_, toTimePoint(started + modelled));
  link->async_wait([this, link, outcome](const boost::system::error_code&) {
    if (!stopping_) settleFetch(outcome, -1);
  });
}

// The landed blocks are used when their content is that of their hashes (the emulator's payload
// is a function of the hash), else the request falls back. No write can reach them any more.
void EngineCoreSide::settleFetch(const worker::RemoteKvOutcome& outcome, Nanos kv_ready_at) {
  size_t good = outcome.landed;
  std::string problem;
  if (auto it = fetches_.find(outcome.id); it != fetches_.end()) {
    const detail::FetchRecord& f = it->second;
    const size_t landed = std::min(good, f.blocks.size());
    for (size_t i = 0; i < landed; ++i) {
      if (!worker::verifyBlockPayload(f.hashes[i], core_->pool().payload(f.blocks[i]))) {
        if (problem.empty()) {
          problem = strCat("block ", i, " landed with content that does not match its hash");
        }
        shared_.m.landed_corrupt->inc();
        good = 0;
      }
    }
    shared_.m.landed_verified->inc(static_cast<double>(landed));
  }
  Nanos now = shared_.engineNow(steadyNanos());
  absl::Status st = good > 0 ? core_->completeRemoteKv(outcome.id, good, now, kv_ready_at)
                             : core_->failRemoteKv(outcome.id, now, false);
  core_->releaseRemoteKvLanding(outcome.id);  // an abort may have quarantined them
  afterChange();
  if (!st.ok() && st.code() != absl::StatusCode::kNotFound) problem = std::string(st.message());
  reportFetch(outcome.id, good, problem.empty() ? outcome.reason : problem);
}

void EngineCoreSide::failRemoteKv(const worker::RemoteKvOutcome& outcome) {
  core_->failRemoteKv(outcome.id, shared_.engineNow(steadyNanos()), outcome.writes_may_arrive)
      .IgnoreError();  // NotFound: the request was aborted meanwhile
  afterChange();
  reportFetch(outcome.id, 0, outcome.reason);
}

void EngineCoreSide::releaseLanding(const std::string& id) {
  core_->releaseRemoteKvLanding(id);
  afterChange();
}

// Counts the fetch and gives its request the kv_transfer_result (posted before any of its
// output, which later steps produce).
void EngineCoreSide::reportFetch(const std::string& id, size_t used, std::string reason) {
  auto it = fetches_.find(id);
  if (it == fetches_.end()) return;
  const size_t requested = it->second.hashes.size();
  const Nanos started = it->second.started;
  fetches_.erase(it);
  const int64_t bs = shared_.config.cache.block_size;
  const uint64_t block_bytes = shared_.config.cache.payload_bytes_per_block;
  KvTransferResult r;
  r.outcome = protocol::transferOutcomeFor(used, requested);
  r.pushed_tokens = static_cast<int64_t>(used) * bs;
  r.pushed_bytes = static_cast<int64_t>(used * block_bytes);
  r.requested_tokens = static_cast<int64_t>(requested) * bs;
  r.reason = std::move(reason);
  EngineShared::Metrics& m = shared_.m;
  (r.outcome == protocol::TransferOutcome::kFallback  ? m.fetch_fallback
   : r.outcome == protocol::TransferOutcome::kPartial ? m.fetch_partial
                                                      : m.fetch_ok)
      ->inc();
  m.tokens_in->inc(static_cast<double>(r.pushed_tokens));
  m.bytes_in->inc(static_cast<double>(r.pushed_bytes));
  m.fetch_seconds->observe(nanosToSeconds(steadyNanos() - started));
  if (used == 0) log::info("kv push fallback", "request", id, "reason", r.reason);
  asio::post(http_->executor(), [http = http_, id, r = std::move(r)]() mutable {
    http->setTransferResult(id, std::move(r));
  });
}

}  // namespace kvf::engine
