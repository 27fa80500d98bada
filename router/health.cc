// Active health checks (eject after consecutive failures, re-admit after passes), the engine
// load scrape from /metrics (and the KV capacity it declares), and the periodic KV-event check.
#include <chrono>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/http_client.h"
#include "common/json.h"
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

// The first model card's max_model_len in a /v1/models answer.
std::optional<int64_t> maxModelLen(std::string_view body) {
  auto object = json::parseObject(body);
  if (!object.ok()) return std::nullopt;
  const auto* data = object->if_contains("data");
  if (data == nullptr || !data->is_array() || data->as_array().empty()) return std::nullopt;
  const auto& card = data->as_array()[0];
  if (!card.is_object()) return std::nullopt;
  auto len = json::getInt(card.as_object(), "max_model_len");
  if (!len.ok() || *len <= 0) return std::nullopt;
  return *len;
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
    if (ok) noteAlive(*instance);
    // Only a late answer (timeout) says the process is alive and only slow; an unreachable one
    // may have been replaced, and one that answers with an error may have lost its cache.
    const bool late = !response.ok() && absl::IsDeadlineExceeded(response.status());
    if (!ok && !late) instance->cache_state_unknown = true;
    switch (core_->healthCheck(instance->slot, ok)) {
      case RoutingCore::HealthChange::kReadmitted:
        // What a replaced or failed process held is unknown: its events rebuild the index. One
        // that only answered late is the same process, and its event stream (gaps replayed or
        // reset) kept the index true.
        if (instance->cache_state_unknown) resetKvInstance(*instance, "readmitted");
        log::info("instance re-admitted", "instance", instance->config.id, "index_kept",
                  !instance->cache_state_unknown);
        instance->cache_state_unknown = false;
        break;
      case RoutingCore::HealthChange::kEjected:
        instance->ejections->inc();
        // Connections to a failed engine are stale; a restarted one gets fresh ones.
        instance->client->closeIdle();
        log::warn("instance ejected", "instance", instance->config.id, "error",
                  response.ok() ? std::to_string(response->status)
                                : std::string(response.status().message()));
        break;
      case RoutingCore::HealthChange::kUnstalled:
        log::info("stalled instance answers again", "instance", instance->config.id);
        break;
      case RoutingCore::HealthChange::kNone:
        // Answering while admitted: a failure before it led to no ejection.
        if (ok && core_->instance(instance->slot).check_healthy) {
          instance->cache_state_unknown = false;
        }
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
        learnKvCapacity(*instance, metrics->body);
        drainQueue();
      }
    }
    if (ok && config_.max_model_len == 0 && learned_max_model_len_ == 0) {
      // vLLM's model cards carry max_model_len: chat's default output is the rest of it.
      http::ClientRequest models;
      models.method = "GET";
      models.target = "/v1/models";
      models.read_timeout = timeout;
      auto cards = co_await instance->client->request(std::move(models));
      if (instance->removed || stopped_) break;
      if (cards.ok() && cards->status == 200) {
        if (auto len = maxModelLen(cards->body)) learned_max_model_len_ = *len;
      }
    }
    checkKvEvents(*instance);
    timer.expires_after(interval);
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

}  // namespace kvf::router
