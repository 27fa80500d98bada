// Active health checks (eject after consecutive failures, re-admit after passes), the engine
// load scrape from /metrics, and application of KV-event updates to the cache index.
#include <chrono>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/http_client.h"
#include "common/log.h"
#include "router/kv_subscriber.h"
#include "router/router.h"
#include "router/router_internal.h"

namespace kvf::router {
namespace {

// Value of the first sample of `name` (any labels) in a Prometheus text exposition.
std::optional<double> sampleValue(std::string_view text, std::string_view name) {
  size_t pos = 0;
  while ((pos = text.find(name, pos)) != std::string_view::npos) {
    bool line_start = pos == 0 || text[pos - 1] == '\n';
    size_t after = pos + name.size();
    if (line_start && after < text.size() && (text[after] == '{' || text[after] == ' ')) {
      size_t eol = text.find('\n', after);
      std::string_view line = text.substr(after, eol == std::string_view::npos ? eol : eol - after);
      size_t space = line.rfind(' ');
      if (space != std::string_view::npos) {
        try {
          return std::stod(std::string(line.substr(space + 1)));
        } catch (...) {
          return std::nullopt;
        }
      }
    }
    pos = after;
  }
  return std::nullopt;
}

}  // namespace

asio::awaitable<void> Router::healthLoop(std::shared_ptr<Instance> instance) {
  asio::steady_timer timer(ioc_);
  auto interval = std::chrono::nanoseconds(config_.health.interval);
  auto timeout = std::chrono::milliseconds(config_.health.timeout / kNanosPerMilli);
  while (!instance->removed && !stopped_) {
    http::ClientRequest check;
    check.method = "GET";
    check.target = "/health";
    check.read_timeout = timeout;
    auto response = co_await instance->client->request(std::move(check));
    if (instance->removed || stopped_) break;
    bool ok = response.ok() && response->status == 200;
    switch (core_->healthCheck(instance->slot, ok)) {
      case RoutingCore::HealthChange::kReadmitted:
        log::info("instance re-admitted", "instance", instance->config.id);
        break;
      case RoutingCore::HealthChange::kEjected:
        instance->ejections->inc();
        // Connections to a failed engine are stale; a restarted one gets fresh ones.
        instance->client->closeIdle();
        log::warn("instance ejected", "instance", instance->config.id, "error",
                  response.ok() ? std::to_string(response->status)
                                : std::string(response.status().message()));
        break;
      case RoutingCore::HealthChange::kNone:
        break;
    }
    if (ok && config_.health.scrape_metrics) {
      http::ClientRequest scrape;
      scrape.method = "GET";
      scrape.target = "/metrics";
      scrape.read_timeout = timeout;
      auto metrics = co_await instance->client->request(std::move(scrape));
      if (instance->removed || stopped_) break;
      if (metrics.ok() && metrics->status == 200) {
        std::optional<int64_t> waiting;
        if (auto v = sampleValue(metrics->body, "vllm:num_requests_waiting")) {
          waiting = static_cast<int64_t>(*v);
        }
        core_->reportEngineLoad(instance->slot, waiting,
                                sampleValue(metrics->body, "vllm:kv_cache_usage_perc"));
      }
    }
    timer.expires_after(interval);
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

void Router::applyKvUpdate(int slot, uint64_t generation, KvUpdate& update) {
  std::shared_ptr<Instance> instance = slots_[slot];
  if (!instance || instance->generation != generation || instance->removed) return;
  if (update.kind == KvUpdate::Kind::kReset) {
    core_->index().clearInstance(slot);
    instance->kv_resets->inc();
    log::warn("KV index reset for instance", "instance", instance->config.id, "reason",
              update.reason);
    return;
  }
  instance->kv_batches->inc();
  double now_wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (update.batch.ts > 0)
    metrics_->kv_event_lag_seconds->observe(std::max(0.0, now_wall - update.batch.ts));
  for (KvEvent& event : update.batch.events) {
    // Only the GPU prefix cache makes a request's prefill cheaper the way the policy assumes.
    bool gpu = event.medium.empty() || event.medium == "GPU";
    switch (event.kind) {
      case KvEventKind::kBlockStored:
        if (!gpu || !core_->index().storeBlocks(slot, event.stored)) {
          metrics_->kv_events_ignored->inc();
        }
        break;
      case KvEventKind::kBlockRemoved:
        if (gpu) {
          core_->index().removeBlocks(slot, event.removed);
        } else {
          metrics_->kv_events_ignored->inc();
        }
        break;
      case KvEventKind::kAllBlocksCleared:
        core_->index().clearInstance(slot);
        instance->kv_resets->inc();
        break;
    }
  }
}

}  // namespace kvf::router
