// KV movement on the request path: push-migrate (D is told to pull the prefix from its holder)
// and prefill offload (P prefills under a lease, then D decodes with P's blocks pushed), with
// fallback to local prefill on D whenever P fails, and the offload cap given back on every path.
#include <chrono>

#include "common/http_client.h"
#include "common/log.h"
#include "common/strings.h"
#include "router/router.h"
#include "router/router_internal.h"

namespace kvf::router {
namespace {

log::RateLimitedLog offload_log;

}  // namespace

void Router::holdPeer(RequestContext& ctx, Instance& peer, int64_t peer_matched_tokens) {
  ctx.peer = slots_[peer.slot];
  if (ctx.decision.mode != policy::Mode::kPrefillOffload) return;
  // The policy counted this offload against its cap: give it back exactly once.
  std::weak_ptr<Router> weak = weak_from_this();
  ctx.offload_slot = OffloadSlot([weak] {
    if (auto self = weak.lock()) self->policy_->offloadFinished();
  });
  // D will hold every full block of the prompt once P's blocks are pushed (decide() caps it).
  ctx.decision.predicted_cached_tokens = ctx.parsed.prompt_tokens;
  ctx.peer_uncached_tokens = std::max<int64_t>(
      0, ctx.parsed.prompt_tokens - std::min(peer_matched_tokens, ctx.parsed.prompt_tokens));
  peer.running += 1;
  peer.pending_prefill_tokens += ctx.peer_uncached_tokens;
  ctx.peer_load_held = true;
}

void Router::releasePeer(RequestContext& ctx) {
  if (!ctx.peer_load_held || !ctx.peer) return;
  ctx.peer->running -= 1;
  ctx.peer->pending_prefill_tokens -= ctx.peer_uncached_tokens;
  ctx.peer_load_held = false;
}

asio::awaitable<std::optional<std::string>> Router::upstreamBody(RequestContext& ctx,
                                                                 const http::Request& request) {
  KvTransferParams params;
  bool with_params = false;
  if (ctx.decision.mode == policy::Mode::kPushMigrate && ctx.peer) {
    params.source = ctx.peer->config.worker_url;
    with_params = true;
  } else if (ctx.decision.mode == policy::Mode::kPrefillOffload && ctx.peer) {
    with_params = co_await remotePrefill(ctx, request, &params);
    if (!with_params) {
      // D prefills everything it does not hold itself.
      int64_t uncached = ctx.parsed.prompt_tokens - ctx.own_matched_tokens;
      if (ctx.prefill_pending)
        ctx.instance->pending_prefill_tokens += uncached - ctx.uncached_tokens;
      ctx.uncached_tokens = uncached;
      ctx.decision.predicted_cached_tokens = ctx.own_matched_tokens;
    }
  }
  // No parameters to add and none from the client to strip: the body goes as it came.
  const bool client_params = ctx.parsed.has_kv_transfer_params;
  if (!with_params && !client_params) {
    co_return std::nullopt;
  }
  auto body = withKvTransferParams(request.body, client_params, with_params ? &params : nullptr);
  // parseRequest accepted the body as a JSON object, so this cannot fail; be safe anyway.
  if (!body.ok()) co_return std::nullopt;
  co_return std::move(*body);
}

asio::awaitable<bool> Router::remotePrefill(RequestContext& ctx, const http::Request& request,
                                            KvTransferParams* params) {
  std::shared_ptr<Instance> p = ctx.peer;
  const auto& elastic = config_.policy.elastic;
  auto fail = [&](std::string_view outcome, std::string_view detail) {
    ctx.offload_prefill = std::string(outcome);
    registry_
        .counter("kvfabric_router_offload_prefills_total",
                 "Prefill halves of offloads by outcome (not ok: D prefilled locally)",
                 {{"outcome", std::string(outcome)}})
        .inc();
    if (outcome != "ok") {
      offload_log.warn("offload prefill failed; decoding instance prefills locally", "prefill",
                       p->config.id, "decode", ctx.instance->config.id, "outcome", outcome,
                       "detail", detail);
    }
    return outcome == "ok";
  };
  auto body = remotePrefillBody(request.body, elastic.lease_ms);
  if (!body.ok()) {
    releasePeer(ctx);
    co_return fail("bad_request", std::string(body.status().message()));
  }
  http::ClientRequest call;
  call.method = "POST";
  call.target = request.target;
  call.body = std::move(*body);
  call.headers.emplace_back("x-request-id", ctx.id + "-prefill");
  if (auto auth = request.header("authorization"); !auth.empty()) {
    call.headers.emplace_back("authorization", std::string(auth));
  }
  call.read_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(elastic.prefill_timeout_s * 1000.0));
  auto response = co_await p->client->request(std::move(call));
  releasePeer(ctx);  // P's prefill phase is over, whatever happened
  if (!response.ok()) {
    bool timeout = absl::IsDeadlineExceeded(response.status());
    recordUpstreamFailure(*p, timeout ? "prefill_timeout" : "prefill");
    co_return fail(timeout ? "timeout" : "error", std::string(response.status().message()));
  }
  if (response->status != 200) {
    co_return fail("error", strCat("status ", response->status));
  }
  recordUpstreamSuccess(*p);
  auto parsed = parseRemotePrefillResponse(response->body, p->config.worker_url);
  if (!parsed.ok()) co_return fail("bad_response", std::string(parsed.status().message()));
  *params = std::move(*parsed);
  // P now caches the prompt's blocks too (its KV events will confirm).
  if (!p->removed) {
    completeHashes(ctx);
    index_.addSoft(p->slot, ctx.hashes, clock_.now(), !p->hasEvents() || !ctx.parsed.has_token_ids);
  }
  co_return fail("ok", "");
}

void Router::recordTransferOutcome(const RequestContext& ctx) {
  if (ctx.decision.mode == policy::Mode::kLocal || !ctx.peer || ctx.status != 200) return;
  // An offload whose prefill failed sent D no params: nothing was transferred.
  if (ctx.decision.mode == policy::Mode::kPrefillOffload && ctx.offload_prefill != "ok") return;
  std::string status(ctx.transfer ? protocol::transferOutcomeName(ctx.transfer->outcome)
                                  : "unreported");
  registry_
      .counter("kvfabric_router_kv_transfers_total",
               "KV transfers by mode and the decoding instance's kv_transfer_result status",
               {{"mode", std::string(policy::modeName(ctx.decision.mode))}, {"status", status}})
      .inc();
  if (ctx.transfer) {
    registry_.counter("kvfabric_router_kv_pushed_tokens_total", "Tokens of KV pushed to decoders")
        .inc(static_cast<double>(ctx.transfer->pushed_tokens));
    registry_.counter("kvfabric_router_kv_pushed_bytes_total", "Bytes of KV pushed to decoders")
        .inc(static_cast<double>(ctx.transfer->pushed_bytes));
  }
}

}  // namespace kvf::router
