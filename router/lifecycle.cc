// Request lifecycle beyond the happy path: when a failed attempt may be retried (never after
// the client left, never past retry_deadline_s), and stall detection.
//
// Stall detection: an instance with requests in flight that shows no sign of life for
// upstream.stall_timeout_s is stalled. Signs of life are per instance, not per request: any
// response byte or header from any of its requests, or a passing health check. A request in a
// long prefill sends nothing, but its engine still answers health checks, so it is never taken
// for a stall; a stopped or wedged process answers nothing at all (docs/router.md "Stalls").
#include <algorithm>
#include <chrono>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/log.h"
#include "router/router.h"
#include "router/router_internal.h"

namespace kvf::router {
namespace {

log::RateLimitedLog retry_log;

}  // namespace

bool Router::mayRetry(const RequestContext& ctx) {
  if (ctx.life->client_gone) {
    // Nobody would read the answer: a retry would only load another engine.
    metrics_->retries_skipped_client_gone->inc();
    return false;
  }
  if (clock_.now() - ctx.start >= config_.retry_deadline) {
    metrics_->retries_skipped_deadline->inc();
    return false;
  }
  return true;
}

Router::ForwardResult Router::failedBeforeFirstByte(RequestContext& ctx, std::string_view kind,
                                                    const absl::Status& error) {
  ctx.status = 0;  // nothing reached the client
  if (ctx.life->client_gone) return ForwardResult::kClientGone;
  const bool stalled = ctx.life->stalled;
  if (stalled) metrics_->stall_retried->inc();
  recordUpstreamFailure(*ctx.instance, stalled ? "stall" : kind);
  retry_log.warn("upstream failed before the first byte; retrying elsewhere", "instance",
                 ctx.instance->config.id, "attempt", ctx.route.attempt(), "kind",
                 stalled ? "stall" : kind, "error", std::string(error.message()));
  return ForwardResult::kRetry;
}

void Router::beginAttempt(RequestContext& ctx) {
  Instance& instance = *ctx.instance;
  // An idle instance has nothing to be silent about: its window starts with this attempt.
  if (instance.attempts.empty()) instance.last_alive = clock_.now();
  instance.attempts.insert(ctx.life.get());
  ctx.life->stalled = false;
  ctx.life->upstream = std::make_shared<http::RequestCanceller>();
}

void Router::endAttempt(RequestContext& ctx) {
  if (ctx.instance) ctx.instance->attempts.erase(ctx.life.get());
  ctx.life->upstream.reset();
}

void Router::noteAlive(Instance& instance) { instance.last_alive = clock_.now(); }

asio::awaitable<void> Router::stallWatch(std::shared_ptr<bool> stop) {
  asio::steady_timer timer(ioc_);
  // Checked several times per window, so a stall is acted on within ~1.2 x stall_timeout.
  const auto period = std::max<std::chrono::nanoseconds>(
      std::chrono::milliseconds(10), std::chrono::nanoseconds(config_.stall_timeout / 5));
  for (;;) {
    timer.expires_after(period);
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (*stop) co_return;  // the router may be gone: touch nothing
    const Nanos now = clock_.now();
    for (const auto& instance : slots_) {
      if (!instance || instance->removed || instance->attempts.empty()) continue;
      if (now - instance->last_alive < config_.stall_timeout) continue;
      declareStalled(*instance, now);
    }
  }
}

void Router::declareStalled(Instance& instance, Nanos now) {
  if (core_->markStalled(instance.slot)) {
    instance.stalls->inc();
    log::warn("instance stalled: no byte and no health answer", "instance", instance.config.id,
              "silent_s", nanosToSeconds(now - instance.last_alive), "requests",
              instance.attempts.size());
  }
  // Each cancelled request decides for itself: retried elsewhere before its first byte, an SSE
  // error after. Cancelling removes nothing from `attempts` here (each attempt leaves itself).
  std::vector<RequestLifecycle*> attempts(instance.attempts.begin(), instance.attempts.end());
  for (RequestLifecycle* life : attempts) {
    life->stalled = true;
    if (life->upstream) life->upstream->cancel();
  }
  // A fresh window: requests that begin later on this instance (there should be none until it
  // is readmitted) are not cancelled at once.
  instance.last_alive = now;
}

}  // namespace kvf::router
