// Request path: parse, decide, forward with bounded retries, pass the response through, and
// close the loop (load accounting, predicted vs actual cached tokens, decision log).
#include <algorithm>
#include <chrono>
#include <cmath>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include "common/http_client.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sse.h"
#include "common/strings.h"
#include "protocol/transfer_auth.h"
#include "router/fast_parse.h"
#include "router/router.h"
#include "router/router_internal.h"

namespace kvf::router {
namespace {

double wallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

log::RateLimitedLog upstream_log;

// usage.prompt_tokens of a response body or SSE event, if it has one.
std::optional<int64_t> usagePromptTokens(std::string_view json_text) {
  if (json_text.find("\"usage\"") == std::string_view::npos) return std::nullopt;
  auto body = json::parseObject(json_text);
  if (!body.ok()) return std::nullopt;
  const auto* usage = body->if_contains("usage");
  if (usage == nullptr || !usage->is_object()) return std::nullopt;
  const auto* n = usage->as_object().if_contains("prompt_tokens");
  if (n == nullptr || !n->is_int64()) return std::nullopt;
  return n->as_int64();
}

}  // namespace

asio::awaitable<void> Router::handleCompletion(ApiKind kind, const http::Request& incoming,
                                               http::ResponseWriter& writer) {
  ++*in_flight_;
  struct InFlight {
    std::shared_ptr<int64_t> count;
    ~InFlight() { --*count; }
  } in_flight{in_flight_};
  RequestContext ctx;
  ctx.start = clock_.now();
  ctx.kind = kind;
  // Unique across router restarts: engines and logs key on it.
  ctx.id = strCat("kvf-", request_prefix_, "-", next_request_++);
  auto* read_ahead = dynamic_cast<PromptReadAhead*>(incoming.body_observer.get());
  auto parsed = parseRequest(kind, incoming, read_ahead ? read_ahead->prefetch() : nullptr);
  if (!parsed.ok()) {
    metrics_->requests_client_error->inc();
    co_await writer.sendStatus(parsed.status());
    co_return;
  }
  ctx.parsed = std::move(*parsed);
  // The output tokens the engine will generate: the body carries the router's default or cap
  // where one applies, and the load accounting uses that value.
  const int64_t effective = effectiveMaxTokens(
      ctx.parsed, kind, config_.default_max_tokens, config_.max_tokens_limit,
      config_.max_model_len > 0 ? config_.max_model_len : learned_max_model_len_);
  std::optional<http::Request> rewritten;
  if ((!ctx.parsed.max_tokens_given && config_.default_max_tokens > 0) ||
      (ctx.parsed.max_tokens_given && effective != ctx.parsed.max_tokens)) {
    if (std::optional<std::string> body = withMaxTokens(incoming.body, effective)) {
      rewritten.emplace(incoming);
      rewritten->body = std::move(*body);
    }
  }
  ctx.parsed.max_tokens = effective;
  const http::Request& request = rewritten ? *rewritten : incoming;
  RequestRoute& route = ctx.route;
  if (read_ahead && read_ahead->prefetch() && read_ahead->prefetch()->used()) {
    // Most blocks were hashed while the body arrived; hash the rest.
    route.hashes = read_ahead->takeHashes();
    route.tokens = ctx.parsed.token_ids;
    core_->completeHashes(route);
  }
  if (!ctx.parsed.has_token_ids) {
    if (!config_.tokenize) {
      metrics_->tokenize_fallbacks_disabled->inc();
    } else if (!(co_await tokenize(ctx, request))) {
      metrics_->tokenize_fallbacks_failed->inc();
    }
  }
  if (isLoraAdapter(ctx.parsed.model)) ctx.parsed.extra_keys.lora_name = ctx.parsed.model;
  if (!ctx.parsed.has_token_ids || !ctx.parsed.extra_keys.empty()) {
    // Text, or blocks the engine keys by adapter, salt or multimodal items: hashed whole here.
    route.hashes = requestHashes(ctx.parsed, config_.index.block_size);
    route.hashes_complete = true;
  }
  route.session = ctx.parsed.session;
  route.prompt_tokens = ctx.parsed.prompt_tokens;
  route.max_tokens = ctx.parsed.max_tokens;
  route.exact = ctx.parsed.has_token_ids;
  route.tokens = ctx.parsed.token_ids;
  // One mechanism for every wait below (queue, response head, body, stream): the client's
  // connection closing cancels what the request awaits.
  writer.watchClientGone([life = ctx.life] { life->clientLeft(); });
  if (!(co_await admit(ctx, writer))) co_return;
  for (;;) {
    if (!decide(ctx)) {
      if (route.attempt() > 1) break;  // earlier attempts failed: that is the upstream's error
      metrics_->requests_unavailable->inc();
      ctx.status = 503;
      co_await writer.sendError(503, "no healthy instance available");
      finishRequest(ctx);
      co_return;
    }
    std::optional<std::string> body = co_await upstreamBody(ctx, request);
    ForwardResult result = co_await forward(ctx, request, std::move(body), writer);
    if (result == ForwardResult::kClientGone) {
      metrics_->requests_cancelled->inc();
      ctx.status = 499;  // nginx's "client closed request", in the decision log only
    }
    if (result != ForwardResult::kRetry) {
      finishRequest(ctx);
      co_return;
    }
    route.exclude();
    finishRequest(ctx);  // logs the failed attempt and releases its load
    if (route.attempt() >= config_.max_attempts) break;
    if (!mayRetry(ctx)) {
      if (ctx.life->client_gone) {
        metrics_->requests_cancelled->inc();
        co_return;
      }
      break;
    }
    metrics_->retries->inc();
  }
  metrics_->requests_upstream_error->inc();
  ctx.status = 502;
  std::string message = strCat("upstream unavailable after ", route.attempt(), " attempt",
                               route.attempt() == 1 ? "" : "s");
  co_await writer.sendError(502, message);
}

struct Router::QueuedWait {
  explicit QueuedWait(asio::any_io_executor executor) : timer(std::move(executor)) {}
  asio::steady_timer timer;
  bool dispatched = false;
};

asio::awaitable<bool> Router::admit(RequestContext& ctx, http::ResponseWriter& writer) {
  const uint64_t ticket = next_ticket_++;
  ShedReason why = ShedReason::kQueueFull;
  RoutingCore::Admission admission = core_->admit(ctx.route, ticket, clock_.now(), &why);
  if (admission == RoutingCore::Admission::kQueued) {
    QueuedWait wait(writer.executor());
    wait.timer.expires_after(std::chrono::nanoseconds(config_.overload.max_wait));
    queued_[ticket] = &wait;
    ctx.life->queue_wait = &wait.timer;
    const Nanos queued_at = clock_.now();
    if (!ctx.life->client_gone) {
      co_await wait.timer.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    ctx.life->queue_wait = nullptr;
    queued_.erase(ticket);
    std::vector<double> bounds(OverloadStats::kWaitBuckets.begin(),
                               OverloadStats::kWaitBuckets.end());
    registry_
        .histogram("kvfabric_router_queue_wait_seconds",
                   "Time requests waited in the router's queue", std::move(bounds))
        .observe(nanosToSeconds(clock_.now() - queued_at));
    if (wait.dispatched && !ctx.life->client_gone) co_return true;
    if (wait.dispatched) {
      drainQueue();  // its turn passes to the next in line
    } else if (ctx.life->client_gone || !core_->expireQueued(ticket, clock_.now())) {
      // The client left, or the router stops: it leaves the queue without counting as shed.
      core_->cancelQueued(ticket);
    }
    if (ctx.life->client_gone) {
      metrics_->requests_cancelled->inc();
      co_return false;
    }
    // Woken by the deadline: still queued, so it is shed.
    why = ShedReason::kWaitTimeout;
  } else if (admission == RoutingCore::Admission::kDispatch) {
    co_return true;
  }
  ctx.status = 429;
  const int retry_after = config_.overload.retry_after_s;
  std::string body = json::errorBody(
      strCat("router overloaded (", shedReasonName(why), "); retry after ", retry_after, " s"),
      json::errorTypeForStatus(429), 429);
  http::Headers headers;
  headers.emplace_back("Retry-After", strCat(retry_after));
  co_await writer.sendJson(429, std::move(body), headers);
  co_return false;
}

void Router::drainQueue() {
  if (core_->queueDepth() == 0) return;
  const Nanos now = clock_.now();
  while (std::optional<uint64_t> ticket = core_->nextDispatch(now)) {
    auto it = queued_.find(*ticket);
    if (it == queued_.end()) continue;
    it->second->dispatched = true;
    it->second->timer.cancel();
  }
}

asio::awaitable<bool> Router::tokenize(RequestContext& ctx, const http::Request& request) {
  std::shared_ptr<Instance> target;
  for (const auto& instance : slots_) {
    if (instance && admitted(*instance)) {
      target = instance;
      break;
    }
  }
  if (!target) co_return false;
  // vLLM's /tokenize takes the same model and prompt/messages (chat applies the template).
  auto body = json::parseObject(request.body);
  if (!body.ok()) co_return false;
  boost::json::object tokenize_body;
  tokenize_body["model"] = ctx.parsed.model;
  std::string_view key = ctx.kind == ApiKind::kChat ? "messages" : "prompt";
  if (const auto* v = body->if_contains(key)) tokenize_body[key] = *v;
  http::ClientRequest call;
  call.method = "POST";
  call.target = "/tokenize";
  call.body = boost::json::serialize(tokenize_body);
  call.read_timeout = std::chrono::milliseconds(config_.tokenize_timeout / kNanosPerMilli);
  auto response = co_await target->client->request(std::move(call));
  if (!response.ok() || response->status != 200) {
    upstream_log.warn("tokenize failed; using the approximate text index", "instance",
                      target->config.id, "status", response.ok() ? response->status : 0);
    co_return false;
  }
  auto result = json::parseObject(response->body);
  if (!result.ok() || !result->contains("tokens") || !result->at("tokens").is_array()) {
    co_return false;
  }
  std::vector<policy::TokenId> tokens;
  tokens.reserve(result->at("tokens").as_array().size());
  for (const auto& t : result->at("tokens").as_array()) {
    if (!t.is_int64() || t.as_int64() < 0 || t.as_int64() > UINT32_MAX) co_return false;
    tokens.push_back(static_cast<policy::TokenId>(t.as_int64()));
  }
  ctx.parsed.token_ids = std::move(tokens);
  ctx.parsed.has_token_ids = true;
  ctx.parsed.prompt_tokens = static_cast<int64_t>(ctx.parsed.token_ids.size());
  co_return true;
}

bool Router::isLoraAdapter(std::string_view model) const {
  return std::find(config_.lora_adapters.begin(), config_.lora_adapters.end(), model) !=
         config_.lora_adapters.end();
}

bool Router::decide(RequestContext& ctx) {
  Nanos now = clock_.now();
  bool chosen = core_->decide(ctx.route, now);
  metrics_->decide_seconds->observe(nanosToSeconds(clock_.now() - now));
  const policy::Decision& decision = ctx.route.decision();
  decisionCounter(decision).inc();
  ctx.instance = nullptr;
  ctx.peer = nullptr;
  ctx.transfer.reset();
  ctx.actual_cached_tokens.reset();
  ctx.peer_leg_s = std::numeric_limits<double>::quiet_NaN();
  ctx.status = 0;
  if (!chosen) return false;
  decisions_by_mode_[static_cast<size_t>(decision.mode)] += 1;
  ctx.instance = slots_[ctx.route.instance()];
  if (ctx.route.peer() >= 0) ctx.peer = slots_[ctx.route.peer()];
  ctx.instance->decisions->inc();
  ctx.instance->routed_since_kv_event += 1;
  ctx.instance->prompt_tokens->inc(static_cast<double>(ctx.parsed.prompt_tokens));
  ctx.instance->predicted_cached_tokens->inc(
      static_cast<double>(ctx.route.predictedCachedTokens()));
  return true;
}

asio::awaitable<Router::ForwardResult> Router::forward(RequestContext& ctx,
                                                       const http::Request& request,
                                                       std::optional<std::string> body,
                                                       http::ResponseWriter& writer) {
  std::shared_ptr<Instance> instance = ctx.instance;
  if (ctx.life->client_gone) co_return ForwardResult::kClientGone;
  // While it waits on the instance, the attempt is the stall watch's to cancel.
  beginAttempt(ctx);
  struct AttemptScope {
    Router* router;
    RequestContext* ctx;
    ~AttemptScope() { router->endAttempt(*ctx); }
  } attempt_scope{this, &ctx};
  http::ClientRequest upstream_request;
  upstream_request.method = "POST";
  upstream_request.target = request.target;
  upstream_request.canceller = ctx.life->upstream;
  if (body) {
    upstream_request.body = std::move(*body);
  } else {
    upstream_request.body_view = request.body;  // `request` outlives this call
  }
  upstream_request.headers.emplace_back("x-request-id", ctx.id);
  if (!ctx.transfer_auth.empty()) {
    upstream_request.headers.emplace_back(std::string(protocol::kTransferAuthHeader),
                                          ctx.transfer_auth);
  }
  if (auto auth = request.header("authorization"); !auth.empty()) {
    upstream_request.headers.emplace_back("authorization", std::string(auth));
  }
  auto opened = co_await instance->client->open(std::move(upstream_request));
  if (!opened.ok()) {
    co_return failedBeforeFirstByte(ctx, "connect", opened.status());
  }
  std::unique_ptr<http::ResponseStream> upstream = std::move(*opened);
  noteAlive(*instance);
  recordUpstreamSuccess(*instance);

  const policy::Decision& decision = ctx.route.decision();
  http::Headers headers = {
      {"x-kvf-instance", instance->config.id},
      {"x-kvf-decision", std::string(policy::modeName(decision.mode))},
      {"x-kvf-mode", std::string(policy::modeName(decision.mode))},
      {"x-kvf-reason", std::string(decision.reason)},
      {"x-kvf-predicted-cached-tokens", std::to_string(ctx.route.predictedCachedTokens())},
      {"x-kvf-request-id", ctx.id}};
  if (ctx.peer) headers.emplace_back("x-kvf-source", ctx.peer->config.id);
  if (!ctx.route.offloadOutcome().empty()) {
    headers.emplace_back("x-kvf-offload-prefill", std::string(ctx.route.offloadOutcome()));
  }
  std::string content_type(upstream->header("content-type"));
  if (content_type.empty()) content_type = "application/json";
  ctx.status = upstream->status();
  if (ctx.status == 200 && content_type.starts_with("text/event-stream")) {
    ForwardResult result = co_await forwardStream(ctx, *upstream, writer, headers);
    if (result == ForwardResult::kDone) predictHeld(ctx);
    co_return result;
  }
  auto response_body = co_await upstream->readAll(64u << 20);
  endPrefillPhase(ctx);
  if (!response_body.ok()) {
    if (ctx.life->client_gone || ctx.life->stalled) {
      co_return failedBeforeFirstByte(ctx, "read", response_body.status());
    }
    // The engine failed while working on it: another engine may fail the same way, so it is
    // not retried (a stall is: the engine stopped, not the request).
    predictHeld(ctx);
    recordUpstreamFailure(*instance, "read");
    metrics_->requests_upstream_error->inc();
    ctx.status = 502;
    std::string message = strCat("upstream ", instance->config.id,
                                 " failed: ", std::string(response_body.status().message()));
    co_await writer.sendError(502, message);
    co_return ForwardResult::kDone;
  }
  noteAlive(*instance);
  ctx.first_byte = clock_.now();
  if (ctx.status < 400) {
    metrics_->requests_ok->inc();
  } else {
    metrics_->requests_upstream_error->inc();
  }
  // The usage report (cached tokens, transfer outcome) only feeds the closed loop: read it
  // after the client has its answer, from a copy when the body is small (the usual case). A
  // text prompt's report first: its prediction is capped by the engine's prompt length.
  constexpr size_t kReportAfterSendBytes = 64 * 1024;
  if (response_body->size() > kReportAfterSendBytes || !ctx.route.exact) {
    applyResponseReport(ctx, *response_body);
    for (auto& [name, value] : headers) {
      if (name == "x-kvf-predicted-cached-tokens") {
        value = std::to_string(ctx.route.predictedCachedTokens());
      }
    }
    co_await writer.send(ctx.status, content_type, std::move(*response_body), headers);
    predictHeld(ctx);
    co_return ForwardResult::kDone;
  }
  std::string sent = *response_body;
  co_await writer.send(ctx.status, content_type, std::move(sent), headers);
  applyResponseReport(ctx, *response_body);
  predictHeld(ctx);
  co_return ForwardResult::kDone;
}

asio::awaitable<Router::ForwardResult> Router::forwardStream(RequestContext& ctx,
                                                             http::ResponseStream& upstream,
                                                             http::ResponseWriter& writer,
                                                             const http::Headers& headers) {
  sse::Parser parser;
  bool parser_ok = true;
  for (;;) {
    auto piece = co_await upstream.next();
    if (!piece.ok()) {
      if (ctx.life->client_gone) co_return ForwardResult::kClientGone;
      if (!writer.started() && ctx.life->stalled) {
        co_return failedBeforeFirstByte(ctx, "stream", piece.status());
      }
      if (!writer.started() &&
          !(co_await writer.beginStream(ctx.status, "text/event-stream", headers)).ok()) {
        ctx.life->clientLeft();
        co_return ForwardResult::kClientGone;
      }
      // Bytes are out, or the engine failed on this request: the client gets an SSE error
      // event and a clean end instead of a hang or a silently truncated stream.
      const bool stalled = ctx.life->stalled;
      recordUpstreamFailure(*ctx.instance, stalled ? "stall" : "stream");
      if (stalled) metrics_->stall_stream_errors->inc();
      metrics_->stream_aborts->inc();
      metrics_->requests_upstream_error->inc();
      ctx.status = 502;
      std::string why = stalled ? strCat("stalled: no byte and no health answer for ",
                                         nanosToSeconds(config_.stall_timeout), " s")
                                : std::string(piece.status().message());
      std::string error =
          json::errorBody(strCat("upstream ", ctx.instance->config.id, " failed mid-stream: ", why),
                          "upstream_error", 502);
      co_await writer.writeEvent(error);
      co_await writer.writeEvent("[DONE]");
      co_await writer.endStream();
      co_return ForwardResult::kDone;
    }
    if (!piece->has_value()) break;
    noteAlive(*ctx.instance);
    if (!writer.started() &&
        !(co_await writer.beginStream(ctx.status, "text/event-stream", headers)).ok()) {
      ctx.life->clientLeft();
      co_return ForwardResult::kClientGone;
    }
    if (ctx.first_byte == 0) ctx.first_byte = clock_.now();
    endPrefillPhase(ctx);  // first bytes: the prefill is done
    if (parser_ok) {
      parser_ok =
          parser.feed(**piece, [&](sse::Event&& e) { applyResponseReport(ctx, e.data); }).ok();
    }
    if (!(co_await writer.writeChunk(**piece)).ok()) {
      ctx.life->clientLeft();  // stops the engine's work too
      co_return ForwardResult::kClientGone;
    }
    predictHeld(ctx);  // once, after the first chunk is on its way
  }
  if (!writer.started() &&
      !(co_await writer.beginStream(ctx.status, "text/event-stream", headers)).ok()) {
    ctx.life->clientLeft();
    co_return ForwardResult::kClientGone;
  }
  metrics_->requests_ok->inc();
  co_await writer.endStream();
  co_return ForwardResult::kDone;
}

void Router::predictHeld(RequestContext& ctx) {
  if (ctx.instance) core_->predict(ctx.route, clock_.now());
}

void Router::applyResponseReport(RequestContext& ctx, std::string_view body) {
  ResponseReport report = readResponseReport(body);
  if (report.cached_tokens) ctx.actual_cached_tokens = report.cached_tokens;
  if (report.transfer) ctx.transfer = std::move(report.transfer);
  if (!ctx.route.exact) {
    if (auto n = usagePromptTokens(body)) core_->reportPromptTokens(ctx.route, *n);
  }
}

void Router::endPrefillPhase(RequestContext& ctx) {
  ctx.route.endPrefill();
  // The offload's cap is held until D's first bytes: until then the pushed blocks are not in.
  ctx.route.releaseOffload();
  drainQueue();
}

void Router::finishRequest(RequestContext& ctx) {
  Instance* instance = ctx.instance.get();
  ctx.route.endAttempt();
  drainQueue();
  recordTransferOutcome(ctx);
  int64_t predicted = ctx.route.predictedCachedTokens();
  if (instance != nullptr && ctx.actual_cached_tokens) {
    int64_t actual = *ctx.actual_cached_tokens;
    instance->actual_cached_tokens->inc(static_cast<double>(actual));
    metrics_->prediction_error_tokens->observe(static_cast<double>(std::llabs(predicted - actual)));
    if (actual < predicted) metrics_->silent_misses->inc();
    // Hits from the engine's lower tiers were known too: only hits beyond the GPU prediction
    // and the tiers' run are unpredicted (the check for a missing event stream).
    const int64_t known = predicted + ctx.route.tierTokens();
    if (actual > known) {
      metrics_->unpredicted_hits->inc();
      instance->unpredicted_hit_tokens->inc(static_cast<double>(actual - known));
    }
  }
  Nanos now = clock_.now();
  metrics_->request_seconds->observe(nanosToSeconds(now - ctx.start));
  DecisionRecord record;
  core_->fillRecord(ctx.route, &record);
  record.ts = wallSeconds() - nanosToSeconds(now - ctx.start);
  record.request_id = ctx.id;
  record.actual_cached_tokens = ctx.actual_cached_tokens;
  record.status = ctx.status;
  record.duration_s = nanosToSeconds(now - ctx.start);
  if (ctx.first_byte > 0) record.ttft_s = nanosToSeconds(ctx.first_byte - ctx.start);
  if (ctx.peer && !record.source.empty()) record.kv_connector = ctx.peer->config.kv_connector;
  record.peer_leg_s = ctx.peer_leg_s;
  if (ctx.transfer) {
    record.transfer_status = protocol::transferOutcomeName(ctx.transfer->outcome);
    record.pushed_tokens = ctx.transfer->pushed_tokens;
    record.pushed_bytes = ctx.transfer->pushed_bytes;
  }
  log_->write(std::move(record));
}

void Router::recordUpstreamFailure(Instance& instance, std::string_view kind) {
  if (!instance.removed) {  // a removed instance's series are retired: do not bring them back
    registry_
        .counter("kvfabric_router_upstream_errors_total", "Upstream failures by instance and kind",
                 {{"instance", instance.config.id}, {"kind", std::string(kind)}})
        .inc();
  }
  // A removed instance's slot may already belong to a new one.
  if (instance.removed || !core_->upstreamFailure(instance.slot, clock_.now())) return;
  instance.circuit_opens->inc();
  log::warn("circuit opened", "instance", instance.config.id, "open_s",
            nanosToSeconds(config_.circuit_open));
}

void Router::recordUpstreamSuccess(Instance& instance) {
  if (!instance.removed) core_->upstreamSuccess(instance.slot);
}

}  // namespace kvf::router
