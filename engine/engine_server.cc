#include "engine/engine_server_impl.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include "common/http_server.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/openai_api.h"
#include "engine/tokenizer.h"
#include "worker/kv_event_publisher.h"

namespace kvf::engine {

using detail::kAwait;
using detail::steadyNanos;
using detail::toTimePoint;
using detail::unixSeconds;
using Steady = std::chrono::steady_clock;

void EngineServer::Impl::registerMetrics() {
  metrics::Labels labels = {{"model_name", config.served_model_name}};
  auto gauge = [&](const char* name, const char* help, std::function<double()> read) {
    registry.callback(name, help, metrics::MetricType::kGauge, labels, std::move(read));
  };
  auto counter = [&](const char* name, const char* help, std::function<double()> read) {
    registry.callback(name, help, metrics::MetricType::kCounter, labels, std::move(read));
  };
  gauge("vllm:num_requests_running", "Requests in the running batch",
        [this] { return snapshot.running.load(); });
  gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled",
        [this] { return snapshot.waiting.load(); });
  gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (0..1)",
        [this] { return snapshot.usage.load(); });
  counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache",
          [this] { return snapshot.queries.load(); });
  counter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache",
          [this] { return snapshot.hits.load(); });
  counter("vllm:prompt_tokens_total", "Prompt tokens of admitted requests",
          [this] { return snapshot.prompt.load(); });
  counter("vllm:generation_tokens_total", "Generated tokens",
          [this] { return snapshot.generation.load(); });
  counter("vllm:num_preemptions_total", "Preemptions (recompute)",
          [this] { return snapshot.preemptions.load(); });
  ttft = &registry.histogram("vllm:time_to_first_token_seconds", "Time to first token (modelled)",
                             metrics::latencyBuckets(), labels);
  tpot = &registry.histogram("vllm:time_per_output_token_seconds",
                             "Mean time per output token after the first (modelled)",
                             metrics::latencyBuckets(), labels);
  e2e = &registry.histogram("vllm:e2e_request_latency_seconds", "Request latency (modelled)",
                            metrics::latencyBuckets(), labels);
  success = &registry.counter("vllm:request_success_total", "Finished requests", labels);
  aborted = &registry.counter("kvfabric_engine_requests_aborted_total",
                              "Requests aborted because the client went away", labels);
  steps = &registry.counter("kvfabric_engine_steps_total", "Engine steps run", labels);
  step_seconds = &registry.histogram("kvfabric_engine_step_duration_seconds",
                                     "Modelled step duration", metrics::latencyBuckets(), labels);
  lateness = &registry.histogram("kvfabric_engine_step_lateness_seconds",
                                 "Wall-clock lateness of step deadlines",
                                 metrics::exponentialBuckets(1e-5, 2, 18), labels);
  gauge("kvfabric_engine_step_lateness_p99_seconds", "p99 lateness over the last 65536 steps",
        [this] { return snapshot.lateness_p99.load(); });
  counter("kvfabric_engine_kv_events_published_total", "KV event batches published",
          [this] { return publisher ? static_cast<double>(publisher->publishedBatches()) : 0.0; });
  counter("kvfabric_engine_kv_events_dropped_total", "KV event batches dropped",
          [this] { return publisher ? static_cast<double>(publisher->droppedBatches()) : 0.0; });
}

double EngineServer::Impl::latenessQuantile(double q) const {
  if (recent_lateness.empty()) return 0;
  std::vector<double> v(recent_lateness.begin(), recent_lateness.end());
  auto k = static_cast<size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

asio::awaitable<void> EngineServer::Impl::stepLoop() {
  Nanos next_wall = steadyNanos();
  while (!stopping) {
    if (!core->hasWork()) {
      idle = true;
      wake_timer.expires_at(Steady::time_point::max());
      co_await wake_timer.async_wait(kAwait);
      idle = false;
      next_wall = steadyNanos();  // an idle engine starts its next step at the arrival
      continue;
    }
    StepResult result = core->step(engineNow(next_wall));
    if (!result.remote_kv_fetches.empty()) {
      publishStats();
      asio::post(ioc, [this, fetches = std::move(result.remote_kv_fetches)]() mutable {
        for (auto& f : fetches) startFetch(std::move(f));
      });
    }
    if (result.empty()) {
      next_wall = steadyNanos();
      continue;
    }
    Nanos end_wall = wallFor(result.start + result.duration);
    step_timer.expires_at(toTimePoint(end_wall));
    co_await step_timer.async_wait(kAwait);
    if (stopping) break;
    Nanos now = steadyNanos();
    double late = nanosToSeconds(std::max<Nanos>(0, now - end_wall));
    lateness->observe(late);
    recent_lateness.push_back(late);
    if (recent_lateness.size() > 65536) recent_lateness.pop_front();
    steps->inc();
    step_seconds->observe(nanosToSeconds(result.duration));
    std::vector<worker::KvEvent> events = step_events.take();
    if (publisher && !events.empty()) publisher->publish(std::move(events), unixSeconds());
    if (static_cast<uint64_t>(steps->value()) % 128 == 0) {
      snapshot.lateness_p99.store(latenessQuantile(0.99));
    }
    publishStats();
    asio::post(ioc, [this, outputs = std::move(result.outputs),
                     end = result.start + result.duration]() { deliver(outputs, end); });
    next_wall = end_wall;  // absolute deadlines: lateness does not accumulate
    if (now - last_progress_log > 10 * kNanosPerSecond) {
      last_progress_log = now;
      auto s = core->stats();
      log::info("engine progress", "running", s.num_running, "waiting", s.num_waiting, "kv_usage",
                core->pool().usage(), "steps", steps->value(), "lateness_p99_ms",
                latenessQuantile(0.99) * 1e3);
    }
  }
}

void EngineServer::Impl::publishStats() {
  SchedulerStats st = core->stats();
  snapshot.running.store(st.num_running);
  snapshot.waiting.store(st.num_waiting);
  snapshot.usage.store(core->pool().usage());
  snapshot.queries.store(static_cast<double>(st.prefix_cache_queries));
  snapshot.hits.store(static_cast<double>(st.prefix_cache_hits));
  snapshot.prompt.store(static_cast<double>(st.prompt_tokens));
  snapshot.generation.store(static_cast<double>(st.generation_tokens));
  snapshot.preemptions.store(static_cast<double>(st.num_preemptions));
  snapshot.waiting_remote.store(st.num_waiting_for_remote_kv);
  snapshot.leases.store(st.num_leases);
  snapshot.quarantined.store(static_cast<double>(st.remote_kv_blocks_quarantined));
}

void EngineServer::Impl::deliver(const std::vector<RequestOutput>& outputs, Nanos end) {
  for (const RequestOutput& out : outputs) {
    auto it = pending.find(out.id);
    if (it == pending.end()) continue;
    Pending& p = *it->second;
    p.tokens.insert(p.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
    p.cached_tokens = out.cached_tokens;
    p.prompt_tokens = out.prompt_tokens;
    if (out.lease_id) {
      p.lease_id = out.lease_id;
      p.lease_block_hashes = out.lease_block_hashes;
    }
    if (out.finish) {
      p.done = true;
      p.finish_reason = finishReasonName(*out.finish);
      recordFinished(out, end);
    }
    p.signal.cancel();
    if (out.finish) pending.erase(it);
  }
}

void EngineServer::Impl::recordFinished(const RequestOutput& out, Nanos end) {
  success->inc();
  if (out.first_token_time >= 0) {
    ttft->observe(nanosToSeconds(out.first_token_time - out.arrival_time));
    if (out.output_tokens > 1) {
      tpot->observe(nanosToSeconds(end - out.first_token_time) /
                    static_cast<double>(out.output_tokens - 1));
    }
  }
  e2e->observe(nanosToSeconds(end - out.arrival_time));
}

}  // namespace kvf::engine
