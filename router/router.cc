#include "router/router.h"

#include <random>

#include <zmq.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "protocol/transfer_auth.h"
#include "router/membership.h"
#include "router/replica_sync.h"
#include "router/replica_wire.h"
#include "router/router_internal.h"

namespace kvf::router {

Router::Router(asio::io_context& ioc, RouterConfig config, const Clock& clock)
    : ioc_(ioc),
      config_(std::move(config)),
      transfer_key_(protocol::transferAuthKey(config_.worker_token)),
      clock_(clock),
      slots_(policy::kMaxInstances) {
  std::random_device random;
  request_prefix_ = fmt::format("{:08x}", random());
}

Router::~Router() { stop(); }

absl::StatusOr<std::shared_ptr<Router>> Router::create(asio::io_context& ioc, RouterConfig config,
                                                       const Clock& clock) {
  std::shared_ptr<Router> router(new Router(ioc, std::move(config), clock));
  KVF_RETURN_IF_ERROR(router->init());
  return router;
}

absl::Status Router::init() {
  KVF_ASSIGN_OR_RETURN(core_, RoutingCore::create(config_));
  KVF_ASSIGN_OR_RETURN(log_, DecisionLog::open(config_.decision_log));
  http::ServerOptions options;
  options.host = config_.host;
  options.port = config_.port;
  options.max_body_bytes = config_.max_body_bytes;
  options.max_connections = config_.max_connections;
  options.max_connections_per_client = config_.max_connections_per_client;
  // Long prompts stream out slowly under load; a single write may wait for the client.
  options.write_timeout = std::chrono::milliseconds(120'000);
  // One thread runs the router's io_context (main.cc, tests' IoThread): no strands needed.
  options.strand_per_connection = false;
  KVF_ASSIGN_OR_RETURN(server_, http::HttpServer::create(ioc_, options));
  zmq_ = std::make_shared<zmq::context_t>(1);

  auto& r = registry_;
  // Every text prompt indexed approximately instead of tokenized, by why: tokenize disabled,
  // or /tokenize failed (no admitted instance, error, bad answer).
  auto tokenizeFallbacks = [&](std::string_view reason) {
    return &r.counter("kvfabric_router_tokenize_fallbacks_total",
                      "Text prompts indexed approximately instead of tokenized, by reason "
                      "(disabled: tokenize.enabled is false; failed: POST /tokenize failed)",
                      {{"reason", std::string(reason)}});
  };
  auto requests = [&](std::string_view outcome) {
    return &r.counter("kvfabric_router_requests_total", "Requests by outcome",
                      {{"outcome", std::string(outcome)}});
  };
  metrics_ = std::make_unique<Metrics>(Metrics{
      requests("ok"),
      requests("client_error"),
      requests("upstream_error"),
      requests("unavailable"),
      &r.counter("kvfabric_router_retries_total", "Attempts retried on another instance"),
      &r.counter("kvfabric_router_stream_aborts_total",
                 "Streams ended with an SSE error event after an upstream failure"),
      &r.counter("kvfabric_router_cache_silent_misses_total",
                 "Requests whose engine-reported cached tokens were below the prediction"),
      &r.counter("kvfabric_router_cache_unpredicted_hits_total",
                 "Requests whose engine-reported cached tokens exceeded the prediction"),
      &r.histogram("kvfabric_router_cache_prediction_error_tokens",
                   "|predicted - actual| cached tokens per request",
                   metrics::exponentialBuckets(16, 2, 14)),
      &r.histogram("kvfabric_router_decide_seconds", "Hash + match + policy time per request",
                   metrics::exponentialBuckets(1e-6, 2, 18)),
      &r.histogram("kvfabric_router_request_seconds", "Request time through the router",
                   metrics::latencyBuckets()),
      &r.histogram("kvfabric_router_kv_event_lag_seconds",
                   "Wall time from an engine's batch timestamp to its application",
                   metrics::exponentialBuckets(1e-4, 2, 18)),
      &r.counter("kvfabric_router_kv_events_ignored_total",
                 "BlockStored events unmappable to our hashes (unknown parent, block size, "
                 "over capacity)"),
      &r.counter("kvfabric_router_kv_events_skipped_total", "KV-event content skipped, by reason",
                 {{"reason", "unknown_type"}}),
      &r.counter("kvfabric_router_kv_events_skipped_total", "KV-event content skipped, by reason",
                 {{"reason", "unknown_field"}}),
      &r.counter("kvfabric_router_kv_events_skipped_total", "KV-event content skipped, by reason",
                 {{"reason", "other_group"}}),
      &r.counter("kvfabric_router_kv_events_skipped_total", "KV-event content skipped, by reason",
                 {{"reason", "tier_full"}}),
      tokenizeFallbacks("disabled"),
      tokenizeFallbacks("failed"),
      &r.counter("kvfabric_router_requests_cancelled_total",
                 "Requests whose client disconnected before the answer was complete (the "
                 "upstream request was cancelled)"),
      &r.counter("kvfabric_router_stalled_requests_total",
                 "Attempts cancelled because their instance stalled, by outcome",
                 {{"outcome", "before_first_byte"}}),
      &r.counter("kvfabric_router_stalled_requests_total",
                 "Attempts cancelled because their instance stalled, by outcome",
                 {{"outcome", "stream_error"}}),
      &r.counter("kvfabric_router_retries_skipped_total", "Retries not made, by reason",
                 {{"reason", "client_gone"}}),
      &r.counter("kvfabric_router_retries_skipped_total", "Retries not made, by reason",
                 {{"reason", "deadline"}})});
  r.callback("kvfabric_router_offloads_in_flight",
             "Prefill offloads whose prefill phase is in flight (against elastic's cap)",
             metrics::MetricType::kGauge, {},
             [this] { return static_cast<double>(core_->policy().offloadsInFlight()); });
  // Overload control (the core's queue): the same names as the simulator's router.metrics.
  r.callback("kvfabric_router_queue_depth", "Requests waiting in the router's queue",
             metrics::MetricType::kGauge, {},
             [this] { return static_cast<double>(core_->queueDepth()); });
  r.callback("kvfabric_router_queued_total", "Requests that waited in the queue",
             metrics::MetricType::kCounter, {},
             [this] { return static_cast<double>(core_->overloadStats().queued); });
  r.callback("kvfabric_router_queue_dispatched_total",
             "Requests that left the queue for an instance", metrics::MetricType::kCounter, {},
             [this] { return static_cast<double>(core_->overloadStats().dispatched); });
  for (int reason = 0; reason < kShedReasons; ++reason) {
    r.callback(
        "kvfabric_router_shed_total", "Requests answered 429 by overload control",
        metrics::MetricType::kCounter,
        {{"reason", std::string(shedReasonName(static_cast<ShedReason>(reason)))}}, [this, reason] {
          return static_cast<double>(core_->overloadStats().shed[static_cast<size_t>(reason)]);
        });
  }
  r.callback("kvfabric_router_index_blocks",
             "Distinct block hashes an instance holds exactly (from KV events)",
             metrics::MetricType::kGauge, {},
             [this] { return static_cast<double>(core_->index().stats().blocks); });
  r.callback("kvfabric_router_index_soft_entries",
             "Predicted + approximate (block, instance) index entries", metrics::MetricType::kGauge,
             {}, [this] { return static_cast<double>(core_->index().stats().soft_entries); });
  r.callback("kvfabric_router_index_soft_blocks",
             "Distinct block hashes with a predicted or approximate entry",
             metrics::MetricType::kGauge, {},
             [this] { return static_cast<double>(core_->index().stats().soft_blocks); });
  r.callback("kvfabric_router_index_rejected_stores_total",
             "BlockStored events that could not be mapped to our hashes",
             metrics::MetricType::kCounter, {},
             [this] { return static_cast<double>(core_->index().stats().stored_events_rejected); });

  for (const InstanceConfig& instance : config_.instances) {
    KVF_RETURN_IF_ERROR(addInstance(instance).status());
  }
  int workers = 0;
  for (const InstanceConfig& instance : config_.instances) workers += !instance.worker_url.empty();
  if (core_->policy().movesKv() && workers < 2) {
    log::warn("KV-moving policy without two instances that have a worker_url: no push or offload",
              "policy", core_->policy().name(), "instances_with_worker", workers);
  }
  if (config_.membership == MembershipSource::kEtcd) {
    membership_ = std::make_unique<EtcdMembership>(*this);
    KVF_RETURN_IF_ERROR(membership_->start());
  }
  if (config_.replicas.enabled()) {
    KVF_ASSIGN_OR_RETURN(replicas_, ReplicaSync::create(ioc_, zmq_, config_.replicas,
                                                        replicaLoadKey(config_.worker_token),
                                                        *core_, clock_, registry_));
    replicas_->start();
  }
  registerRoutes();
  server_->start();
  if (config_.stall_timeout > 0) {
    asio::co_spawn(ioc_, stallWatch(stall_watch_stop_), asio::detached);
  }
  log::info("router listening", "host", config_.host, "port", server_->port(), "policy",
            core_->policy().name(), "instances", config_.instances.size());
  return absl::OkStatus();
}

uint16_t Router::port() const { return server_->port(); }

void Router::stop() {
  if (stopped_) return;
  stopped_ = true;
  *stall_watch_stop_ = true;
  if (membership_) membership_->stop();
  if (replicas_) replicas_->stop();
  if (server_) server_->stop();
  for (auto& instance : slots_) {
    if (!instance) continue;
    instance->removed = true;
    instance->subscribers.clear();
  }
}

std::shared_ptr<Instance> Router::findInstance(std::string_view id) const {
  for (const auto& instance : slots_) {
    if (instance && instance->config.id == id) return instance;
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<Instance>> Router::addInstance(const InstanceConfig& config,
                                                              bool admit_now) {
  if (findInstance(config.id)) {
    return absl::AlreadyExistsError(strCat("instance \"", config.id, "\" already exists"));
  }
  auto free_slot = std::find(slots_.begin(), slots_.end(), nullptr);
  if (free_slot == slots_.end()) {
    return absl::ResourceExhaustedError(strCat("at most ", policy::kMaxInstances, " instances"));
  }
  auto instance = std::make_shared<Instance>();
  instance->config = config;
  instance->slot = static_cast<int>(free_slot - slots_.begin());
  instance->generation = next_generation_++;
  http::ClientOptions options;
  options.connect_timeout = std::chrono::milliseconds(config_.connect_timeout / kNanosPerMilli);
  options.read_timeout = std::chrono::milliseconds(config_.read_timeout / kNanosPerMilli);
  options.max_idle_connections = 256;
  instance->client =
      http::HttpClient::create(ioc_.get_executor(), config.host, config.port, options);
  // A reused slot starts empty in the index, healthy and without load.
  core_->addInstance(instance->slot, config.id, instance->pushCapable(), instance->hasEvents(),
                     admit_now);
  core_->setNixl(instance->slot, instance->nixl());
  *free_slot = instance;
  registerInstanceMetrics(instance);
  startKvSubscribers(instance);
  asio::co_spawn(ioc_, healthLoop(instance), asio::detached);
  log::info("instance added", "id", config.id, "url", config.url, "slot", instance->slot,
            "kv_events", config.kv_events.endpoint.empty() ? "none" : config.kv_events.endpoint);
  return instance;
}

void Router::removeInstance(const std::shared_ptr<Instance>& instance) {
  instance->removed = true;
  instance->subscribers.clear();
  core_->removeInstance(instance->slot);
  slots_[instance->slot] = nullptr;
  // Its series leave /metrics (a cluster that churns instances would otherwise grow them
  // without bound); an instance re-added under the same id starts new ones.
  instance->retired_metrics = registry_.retire("instance", instance->config.id);
  log::info("instance removed", "id", instance->config.id);
}

metrics::Counter& Router::decisionCounter(const policy::Decision& decision) {
  for (const auto& c : decision_counters_) {
    // Reasons are static strings: compare pointers first, contents only on a miss.
    if (c.mode == decision.mode &&
        (c.reason.data() == decision.reason.data() || c.reason == decision.reason)) {
      return *c.counter;
    }
  }
  auto& counter = registry_.counter("kvfabric_router_decisions_total",
                                    "Routing decisions by policy, mode and reason",
                                    {{"policy", std::string(core_->policy().name())},
                                     {"mode", std::string(policy::modeName(decision.mode))},
                                     {"reason", std::string(decision.reason)}});
  decision_counters_.push_back({decision.mode, decision.reason, &counter});
  return counter;
}

void Router::registerInstanceMetrics(const std::shared_ptr<Instance>& instance) {
  metrics::Labels labels = {{"instance", instance->config.id}};
  auto& r = registry_;
  instance->decisions = &r.counter("kvfabric_router_instance_requests_total",
                                   "Requests routed to the instance", labels);
  instance->prompt_tokens = &r.counter("kvfabric_router_instance_prompt_tokens_total",
                                       "Prompt tokens routed to the instance", labels);
  instance->predicted_cached_tokens =
      &r.counter("kvfabric_router_instance_predicted_cached_tokens_total",
                 "Cached tokens the index predicted on the instance", labels);
  instance->actual_cached_tokens =
      &r.counter("kvfabric_router_instance_actual_cached_tokens_total",
                 "Cached tokens the engine reported (requests that reported usage)", labels);
  instance->ejections =
      &r.counter("kvfabric_router_instance_ejections_total", "Health-check ejections", labels);
  instance->circuit_opens = &r.counter("kvfabric_router_instance_circuit_opens_total",
                                       "Circuit breaker openings", labels);
  instance->stalls =
      &r.counter("kvfabric_router_instance_stalls_total",
                 "Times the instance was found stalled (upstream.stall_timeout_s)", labels);
  instance->kv_batches =
      &r.counter("kvfabric_router_instance_kv_batches_total", "KV event batches applied", labels);
  instance->kv_resets = &r.counter("kvfabric_router_instance_kv_resets_total",
                                   "Index resets (restart, AllBlocksCleared, lost events)", labels);
  instance->kv_decode_errors =
      &r.counter("kvfabric_router_instance_kv_decode_errors_total",
                 "Undecodable KV event batches (each resets the instance's index)", labels);
  instance->kv_lost = &r.counter("kvfabric_router_instance_kv_lost_batches_total",
                                 "KV event batches never seen: late join, unrecovered gap", labels);
  instance->unpredicted_hit_tokens =
      &r.counter("kvfabric_router_instance_unpredicted_hit_tokens_total",
                 "Cached tokens the engine reported beyond the router's prediction", labels);
  std::weak_ptr<Instance> weak = instance;
  auto gauge = [&](std::string_view name, std::string_view help, auto read) {
    r.callback(name, help, metrics::MetricType::kGauge, labels, [weak, read] {
      auto i = weak.lock();
      return i && !i->removed ? read(*i) : 0.0;
    });
  };
  gauge("kvfabric_router_instance_running", "Requests in flight (router-accounted)",
        [this](const Instance& i) { return static_cast<double>(core_->instance(i.slot).running); });
  gauge("kvfabric_router_instance_pending_prefill_tokens",
        "Uncached tokens routed and not yet past first token", [this](const Instance& i) {
          return static_cast<double>(core_->instance(i.slot).pending_prefill_tokens);
        });
  gauge("kvfabric_router_instance_stalled", "1 while stalled (until a health check passes)",
        [this](const Instance& i) { return core_->instance(i.slot).stalled ? 1.0 : 0.0; });
  gauge("kvfabric_router_instance_healthy",
        "1 when admitted (healthy, not stalled, not drained, circuit closed)",
        [this](const Instance& i) { return admitted(i) ? 1.0 : 0.0; });
  gauge("kvfabric_router_instance_index_blocks", "Blocks the instance holds per its KV events",
        [this](const Instance& i) {
          return static_cast<double>(core_->index().instanceBlocks(i.slot));
        });
  gauge("kvfabric_router_instance_kv_last_event_age_seconds",
        "Seconds since the instance's last KV event batch (-1: none yet)",
        [this](const Instance& i) {
          return i.last_kv_event != 0 ? nanosToSeconds(clock_.now() - i.last_kv_event) : -1.0;
        });
  gauge("kvfabric_router_instance_kv_events_silent",
        "1 when the instance served requests but its KV events stopped (kv_events.silent_after_s)",
        [](const Instance& i) { return i.kv_events_silent ? 1.0 : 0.0; });
  gauge("kvfabric_router_instance_predicted_hit_ratio",
        "Predicted cached tokens / prompt tokens routed to the instance", [](const Instance& i) {
          double p = i.prompt_tokens->value();
          return p > 0 ? i.predicted_cached_tokens->value() / p : 0.0;
        });
}

bool Router::admitted(const Instance& instance) const {
  return !instance.removed && core_->admitted(instance.slot, clock_.now());
}

}  // namespace kvf::router
