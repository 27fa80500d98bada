// EngineServer: builds the two sides, the KV-event publisher and the worker agent, and registers
// the engine's metrics.
#include "engine/engine_server.h"

#include <cstdlib>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/engine_server_impl.h"
#include "transport/transport.h"

namespace kvf::engine {

using detail::steadyNanos;

absl::StatusOr<std::unique_ptr<EngineServer>> EngineServer::create(asio::io_context& ioc,
                                                                   EngineConfig config) {
  auto impl = std::make_unique<Impl>(ioc, std::move(config));
  const EngineConfig& c = impl->shared.config;
  if (c.kv_events.enabled) {
    worker::PublisherOptions po;
    po.endpoint = c.kv_events.endpoint;
    po.replay_endpoint = c.kv_events.replay_endpoint;
    po.topic = c.kv_events.topic;
    po.buffer_batches = static_cast<size_t>(c.kv_events.buffer_batches);
    po.buffer_bytes = static_cast<size_t>(c.kv_events.buffer_bytes);
    KVF_ASSIGN_OR_RETURN(impl->publisher, worker::KvEventPublisher::create(po));
  }
  KVF_RETURN_IF_ERROR(impl->core_side.createCore());
  KVF_RETURN_IF_ERROR(impl->http_side.bind());
  impl->registerMetrics();
  if (c.worker.port > 0) {
    const WorkerConfig& wc = c.worker;
    if (c.cache.payload_bytes_per_block == 0) {
      return absl::InvalidArgumentError("worker: KV push needs cache.payload_bytes_per_block > 0");
    }
    transport::TransportOptions to;
    to.name = c.instance_id;
    to.transports = wc.transports;
    to.net_devices = wc.net_devices;
    to.max_blocks_per_put = static_cast<uint32_t>(wc.max_push_blocks);
    KVF_ASSIGN_OR_RETURN(auto transport, transport::TransportContext::create(to));
    worker::AgentOptions ao;
    ao.instance_id = c.instance_id;
    ao.host = wc.host;
    ao.port = static_cast<uint16_t>(wc.port);
    ao.token = wc.token;
    if (ao.token.empty()) {
      if (const char* env = std::getenv("KVF_WORKER_TOKEN"); env != nullptr) ao.token = env;
    }
    ao.insecure = wc.insecure;
    if (ao.token.empty() && !wc.insecure) {
      return absl::InvalidArgumentError(
          "worker.token: the worker API needs the cluster's token (worker.token or env "
          "KVF_WORKER_TOKEN); set worker.insecure: true to run it unauthenticated (test only)");
    }
    impl->http_side.setTransferAuth(protocol::transferAuthKey(ao.token));
    ao.max_push_blocks = static_cast<size_t>(wc.max_push_blocks);
    ao.push_bounce_bytes = static_cast<uint64_t>(wc.push_bounce_mib) << 20;
    ao.advertise_url = wc.advertise_url;
    if (ao.advertise_url.empty() && !c.membership.advertise_host.empty()) {
      ao.advertise_url = strCat("http://", c.membership.advertise_host, ":", wc.port);
    }
    ao.peers = wc.peers;
    ao.connect_timeout = std::chrono::milliseconds(wc.push_deadline_cap_ms);
    ao.metric_labels = {{"model_name", c.served_model_name}};
    ao.engine_id = wc.engine_id.empty() ? c.instance_id : wc.engine_id;
    ao.fault = wc.fault;
    ao.fault_stall_ms = wc.fault_stall_ms;
    KVF_ASSIGN_OR_RETURN(impl->agent,
                         worker::WorkerAgent::create(ioc, impl->core_side, std::move(transport),
                                                     std::move(ao), &impl->shared.registry));
    impl->registerPushMetrics();
  }
  impl->core_side.connect(&impl->http_side, impl->publisher.get(), impl->agent.get());
  impl->http_side.connect(impl->agent.get(), impl->publisher.get());
  return std::unique_ptr<EngineServer>(new EngineServer(std::move(impl)));
}

EngineServer::EngineServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EngineServer::~EngineServer() {
  if (!impl_) return;
  impl_->core_side.shutdown();
  if (impl_->publisher) impl_->publisher->stop();
}

void EngineServer::start() {
  impl_->shared.wall_origin = steadyNanos();
  impl_->http_side.start();
  if (impl_->agent) impl_->agent->start();
  impl_->core_side.start();
}

void EngineServer::stop() {
  impl_->core_side.shutdown();
  impl_->http_side.stop();
  if (impl_->agent) impl_->agent->stop();
  if (impl_->publisher) impl_->publisher->stop();
}

uint16_t EngineServer::port() const { return impl_->http_side.port(); }
uint16_t EngineServer::workerPort() const { return impl_->agent ? impl_->agent->port() : 0; }
std::string EngineServer::workerUrl() const {
  return impl_->agent ? impl_->agent->url() : std::string();
}
std::string EngineServer::kvEventsEndpoint() const {
  return impl_->publisher ? impl_->publisher->endpoint() : std::string();
}
std::string EngineServer::kvReplayEndpoint() const {
  return impl_->publisher ? impl_->publisher->replayEndpoint() : std::string();
}
const EngineConfig& EngineServer::config() const { return impl_->shared.config; }

void EngineServer::Impl::registerMetrics() {
  const EngineConfig& config = shared.config;
  metrics::Registry& registry = shared.registry;
  EngineShared::StatsSnapshot& snapshot = shared.snapshot;
  EngineShared::Metrics& m = shared.m;
  metrics::Labels labels = {{"model_name", config.served_model_name}};
  auto gauge = [&](const char* name, const char* help, std::function<double()> read) {
    registry.callback(name, help, metrics::MetricType::kGauge, labels, std::move(read));
  };
  auto counter = [&](const char* name, const char* help, std::function<double()> read) {
    registry.callback(name, help, metrics::MetricType::kCounter, labels, std::move(read));
  };
  gauge("vllm:num_requests_running", "Requests in the running batch",
        [&snapshot] { return snapshot.running.load(); });
  gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled",
        [&snapshot] { return snapshot.waiting.load(); });
  gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (0..1)",
        [&snapshot] { return snapshot.usage.load(); });
  counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache",
          [&snapshot] { return snapshot.queries.load(); });
  counter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache",
          [&snapshot] { return snapshot.hits.load(); });
  counter("vllm:prompt_tokens_total", "Prompt tokens of admitted requests",
          [&snapshot] { return snapshot.prompt.load(); });
  counter("vllm:generation_tokens_total", "Generated tokens",
          [&snapshot] { return snapshot.generation.load(); });
  counter("vllm:num_preemptions_total", "Preemptions (recompute)",
          [&snapshot] { return snapshot.preemptions.load(); });
  // Queued-time prefetch (docs/tiers.md): blocks, in the snapshot's order.
  const std::pair<const char*, const char*> prefetch[] = {
      {"kvfabric_engine_prefetch_promoted_blocks_total",
       "Disk blocks of waiting requests whose promotion into host memory started"},
      {"kvfabric_engine_prefetch_used_blocks_total",
       "Promoted blocks onboarded from host memory at admission"},
      {"kvfabric_engine_prefetch_late_blocks_total",
       "Promoted blocks met at admission before their promotion was done (read from disk)"},
      {"kvfabric_engine_prefetch_wasted_blocks_total",
       "Promotions no admitted request used (late, evicted before use, or not needed)"},
      {"kvfabric_engine_prefetch_touched_blocks_total",
       "Host blocks of waiting requests made most recently used"}};
  for (size_t i = 0; i < std::size(prefetch); ++i) {
    counter(prefetch[i].first, prefetch[i].second,
            [&snapshot, i] { return snapshot.prefetch[i].load(); });
  }
  for (size_t i = 0; i < kPrefetchSkipCount; ++i) {
    metrics::Labels l = labels;
    l.emplace_back("reason", prefetchSkipName(static_cast<PrefetchSkip>(i)));
    registry.callback(
        "kvfabric_engine_prefetch_skipped_blocks_total",
        "Disk blocks of waiting requests not promoted, by reason", metrics::MetricType::kCounter, l,
        [&snapshot, j = std::size(prefetch) + i] { return snapshot.prefetch[j].load(); });
  }
  m.ttft = &registry.histogram("vllm:time_to_first_token_seconds", "Time to first token (modelled)",
                               metrics::latencyBuckets(), labels);
  m.tpot = &registry.histogram("vllm:time_per_output_token_seconds",
                               "Mean time per output token after the first (modelled)",
                               metrics::latencyBuckets(), labels);
  m.e2e = &registry.histogram("vllm:e2e_request_latency_seconds", "Request latency (modelled)",
                              metrics::latencyBuckets(), labels);
  m.success = &registry.counter("vllm:request_success_total", "Finished requests", labels);
  m.aborted = &registry.counter("kvfabric_engine_requests_aborted_total",
                                "Requests aborted because the client went away", labels);
  m.steps = &registry.counter("kvfabric_engine_steps_total", "Engine steps run", labels);
  m.step_seconds = &registry.histogram("kvfabric_engine_step_duration_seconds",
                                       "Modelled step duration", metrics::latencyBuckets(), labels);
  m.lateness = &registry.histogram("kvfabric_engine_step_lateness_seconds",
                                   "Wall-clock lateness of step deadlines",
                                   metrics::exponentialBuckets(1e-5, 2, 18), labels);
  gauge("kvfabric_engine_step_lateness_p99_seconds", "p99 lateness over the last 65536 steps",
        [&snapshot] { return snapshot.lateness_p99.load(); });
  worker::KvEventPublisher* pub = publisher.get();
  counter("kvfabric_engine_kv_events_published_total", "KV event batches published",
          [pub] { return pub ? static_cast<double>(pub->publishedBatches()) : 0.0; });
  counter("kvfabric_engine_kv_events_dropped_total", "KV event batches dropped",
          [pub] { return pub ? static_cast<double>(pub->droppedBatches()) : 0.0; });
  counter("kvfabric_engine_kv_events_replay_trimmed_total",
          "KV event batches trimmed from the replay buffer to keep it within buffer_bytes",
          [pub] { return pub ? static_cast<double>(pub->replayTrimmedBatches()) : 0.0; });
  counter("kvfabric_engine_kv_events_replay_trimmed_bytes_total",
          "Encoded bytes of the KV event batches trimmed for buffer_bytes",
          [pub] { return pub ? static_cast<double>(pub->replayTrimmedBytes()) : 0.0; });
  gauge("kvfabric_engine_kv_events_replay_buffer_bytes",
        "Encoded bytes of the KV event batches kept for replay",
        [pub] { return pub ? static_cast<double>(pub->replayBufferBytes()) : 0.0; });
}

void EngineServer::Impl::registerPushMetrics() {
  metrics::Registry& registry = shared.registry;
  EngineShared::StatsSnapshot& snapshot = shared.snapshot;
  EngineShared::Metrics& m = shared.m;
  metrics::Labels labels = {{"model_name", shared.config.served_model_name}};
  auto with = [&](const char* key, const char* value) {
    metrics::Labels l = labels;
    l.emplace_back(key, value);
    return l;
  };
  m.kv_transfer_refused = &registry.counter(
      "kvfabric_engine_kv_transfer_params_refused_total",
      "Requests whose kv_transfer_params were not signed by the router (403)", labels);
  m.leases_refused = &registry.counter(
      "kvfabric_engine_leases_refused_total",
      "do_remote_decode requests refused because the lease bounds were reached (429)", labels);
  const char* fetches = "kvfabric_engine_kv_push_fetches_total";
  const char* fetch_help = "Remote-KV fetches by outcome (ok, partial, fallback)";
  m.fetch_ok = &registry.counter(fetches, fetch_help, with("outcome", "ok"));
  m.fetch_partial = &registry.counter(fetches, fetch_help, with("outcome", "partial"));
  m.fetch_fallback = &registry.counter(fetches, fetch_help, with("outcome", "fallback"));
  m.tokens_in = &registry.counter("kvfabric_engine_kv_push_received_tokens_total",
                                  "Tokens of KV received from peers and used", labels);
  m.bytes_in = &registry.counter("kvfabric_engine_kv_push_received_bytes_total",
                                 "Payload bytes received from peers and used", labels);
  m.landed_verified =
      &registry.counter("kvfabric_engine_kv_push_verified_blocks_total",
                        "Landed blocks checked byte for byte against their hashes", labels);
  m.landed_corrupt = &registry.counter(
      "kvfabric_engine_kv_push_corrupt_blocks_total",
      "Landed blocks whose content did not match their hash (the fetch fell back)", labels);
  m.fetch_seconds = &registry.histogram(
      "kvfabric_engine_kv_push_fetch_seconds",
      "Wall time from fetch start to complete/fail (includes the modelled link time)",
      metrics::exponentialBuckets(1e-4, 2, 16), labels);
  registry.callback("kvfabric_engine_kv_push_waiting", "Requests waiting for remote KV",
                    metrics::MetricType::kGauge, labels,
                    [&snapshot] { return snapshot.waiting_remote.load(); });
  worker::WorkerAgent* a = agent.get();
  registry.callback("kvfabric_engine_kv_push_leases", "Remote-decode leases holding blocks",
                    metrics::MetricType::kGauge, labels,
                    [a] { return static_cast<double>(a->leaseCount()); });
  registry.callback("kvfabric_engine_kv_push_quarantined_blocks",
                    "Landing blocks held until no late write can reach them",
                    metrics::MetricType::kGauge, labels,
                    [&snapshot] { return snapshot.quarantined.load(); });
}

}  // namespace kvf::engine
