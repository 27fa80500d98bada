// KV movement on the request path: push-migrate (D is told to pull the prefix from its holder)
// and prefill offload (P prefills under a lease, then D decodes with P's blocks pushed), with
// fallback to local prefill on D whenever P fails, and the offload cap given back on every path.
#include <chrono>

#include "common/http_client.h"
#include "common/log.h"
#include "common/strings.h"
#include "protocol/transfer_auth.h"
#include "router/router.h"
#include "router/router_internal.h"

namespace kvf::router {
namespace {

namespace bj = boost::json;

log::RateLimitedLog offload_log;

}  // namespace

asio::awaitable<std::optional<std::string>> Router::upstreamBody(RequestContext& ctx,
                                                                 const http::Request& request) {
  KvTransferParams params;
  bool with_params = false;
  policy::Mode mode = ctx.route.decision().mode;
  if (mode != policy::Mode::kLocal && ctx.peer && ctx.peer->nixl()) {
    // vLLM's NixlConnector: the holder's leg first (P prefills; C's prefill of the prefix it
    // holds is a cache hit), then D gets its answer unchanged and reads the blocks.
    std::optional<bj::value> nixl;
    if (co_await remotePrefill(ctx, request, &params, &nixl)) {
      auto body = withRawKvTransferParams(request.body, *nixl);
      if (body.ok()) {
        ctx.transfer_auth = signTransfer(*nixl, ctx.id);
        co_return std::move(*body);
      }
    }
    // No usable answer: D prefills locally, without params it would not read.
    ctx.transfer_auth.clear();
    auto body = withKvTransferParams(request.body, ctx.parsed.has_kv_transfer_params, nullptr);
    if (!body.ok()) co_return std::nullopt;
    co_return std::move(*body);
  }
  if (mode == policy::Mode::kPushMigrate && ctx.peer) {
    params.source = ctx.peer->config.worker_url;
    with_params = true;
  } else if (mode == policy::Mode::kPrefillOffload && ctx.peer) {
    // Without P's params D prefills everything it does not hold (RequestRoute::peerFailed).
    with_params = co_await remotePrefill(ctx, request, &params);
  }
  // No parameters to add and none from the client to strip: the body goes as it came.
  const bool client_params = ctx.parsed.has_kv_transfer_params;
  ctx.transfer_auth = with_params ? signTransfer(params, ctx.id) : std::string();
  if (!with_params && !client_params) {
    co_return std::nullopt;
  }
  auto body = withKvTransferParams(request.body, client_params, with_params ? &params : nullptr);
  // parseRequest accepted the body as a JSON object, so this cannot fail; be safe anyway.
  if (!body.ok()) co_return std::nullopt;
  co_return std::move(*body);
}

asio::awaitable<bool> Router::remotePrefill(RequestContext& ctx, const http::Request& request,
                                            KvTransferParams* params,
                                            std::optional<bj::value>* nixl_params) {
  std::shared_ptr<Instance> p = ctx.peer;
  const policy::OffloadTerms terms = core_->policy().offloadTerms();
  // `outcome` is a static string: the route keeps it for the record and the header.
  auto fail = [&](std::string_view outcome, std::string_view detail) {
    if (outcome == "ok") {
      ctx.route.peerSucceeded();
    } else {
      ctx.route.peerFailed(outcome);
    }
    registry_
        .counter("kvfabric_router_offload_prefills_total",
                 "Prefill halves of offloads by outcome (not ok: D prefilled locally)",
                 {{"outcome", std::string(outcome)}})
        .inc();
    if (outcome != "ok" && outcome != "cancelled") {
      offload_log.warn("offload prefill failed; decoding instance prefills locally", "prefill",
                       p->config.id, "decode", ctx.instance->config.id, "outcome", outcome,
                       "detail", detail);
    }
    return outcome == "ok";
  };
  if (ctx.life->client_gone) {
    ctx.route.endPeerLoad();
    co_return fail("cancelled", "the client left");
  }
  auto body = nixl_params != nullptr ? nixlPrefillBody(request.body)
                                     : remotePrefillBody(request.body, terms.lease_ms);
  if (!body.ok()) {
    ctx.route.endPeerLoad();
    co_return fail("bad_request", std::string(body.status().message()));
  }
  http::ClientRequest call;
  call.method = "POST";
  call.target = request.target;
  call.body = std::move(*body);
  // vLLM's proxy sends one X-Request-Id on both legs of a NIXL transfer; each leg's params are
  // signed under it with their own nonce, exactly as they are sent.
  const std::string prefill_id = nixl_params != nullptr ? ctx.id : ctx.id + "-prefill";
  call.headers.emplace_back("x-request-id", prefill_id);
  std::string signature;
  if (nixl_params != nullptr) {
    signature = signTransfer(bj::value(protocol::nixlPrefillLegParams()), prefill_id);
  } else {
    KvTransferParams prefill_params;
    prefill_params.do_remote_decode = true;
    prefill_params.lease_ms = terms.lease_ms;
    signature = signTransfer(prefill_params, prefill_id);
  }
  if (!signature.empty()) {
    call.headers.emplace_back(std::string(protocol::kTransferAuthHeader), std::move(signature));
  }
  if (auto auth = request.header("authorization"); !auth.empty()) {
    call.headers.emplace_back("authorization", std::string(auth));
  }
  call.read_timeout = std::chrono::milliseconds(terms.prefill_timeout / kNanosPerMilli);
  // The client leaving closes this leg's connection, so P's engine aborts the prefill at once
  // (as vLLM's server does) and neither computes nor leases blocks for nobody.
  call.canceller = std::make_shared<http::RequestCanceller>();
  ctx.life->upstream = call.canceller;
  const Nanos leg_start = clock_.now();
  auto response = co_await p->client->request(std::move(call));
  ctx.peer_leg_s = nanosToSeconds(clock_.now() - leg_start);
  ctx.life->upstream.reset();
  ctx.route.endPeerLoad();  // P's prefill phase is over, whatever happened
  if (ctx.life->client_gone) {
    // Not P's failure. An answer that raced the client's leaving names a lease nobody will
    // read: it expires on P (lease_ms; vLLM: its abort timeout).
    co_return fail("cancelled", "the client left");
  }
  if (!response.ok()) {
    bool timeout = absl::IsDeadlineExceeded(response.status());
    recordUpstreamFailure(*p, timeout ? "prefill_timeout" : "prefill");
    co_return fail(timeout ? "timeout" : "error", std::string(response.status().message()));
  }
  if (response->status != 200) {
    co_return fail("error", strCat("status ", response->status));
  }
  recordUpstreamSuccess(*p);
  if (nixl_params != nullptr) {
    auto answer = parseNixlPrefillResponse(response->body, nixlSideChannel(p->config));
    if (!answer.ok()) co_return fail("bad_response", std::string(answer.status().message()));
    *nixl_params = std::move(*answer);
    core_->predictPeer(ctx.route, clock_.now());
    co_return fail("ok", "");
  }
  auto parsed = parseRemotePrefillResponse(response->body, p->config.worker_url);
  if (!parsed.ok()) co_return fail("bad_response", std::string(parsed.status().message()));
  *params = std::move(*parsed);
  // P now caches the prompt's blocks too (its KV events will confirm).
  core_->predictPeer(ctx.route, clock_.now());
  co_return fail("ok", "");
}

std::string Router::signTransfer(const KvTransferParams& params,
                                 const std::string& request_id) const {
  return signTransfer(bj::value(protocol::kvTransferParamsJson(params)), request_id);
}

std::string Router::signTransfer(const bj::value& params, const std::string& request_id) const {
  if (transfer_key_.empty()) return {};
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  return protocol::signKvTransfer(transfer_key_, params, request_id, now_ms,
                                  protocol::randomNonce());
}

void Router::recordTransferOutcome(const RequestContext& ctx) {
  policy::Mode mode = ctx.route.decision().mode;
  if (mode == policy::Mode::kLocal || !ctx.peer || ctx.status != 200) return;
  // A first leg that failed (offload, or a NIXL-dialect migration) sent D no params: nothing
  // was transferred.
  if (!ctx.route.offloadOutcome().empty() && ctx.route.offloadOutcome() != "ok") return;
  std::string status(ctx.transfer ? protocol::transferOutcomeName(ctx.transfer->outcome)
                                  : "unreported");
  registry_
      .counter("kvfabric_router_kv_transfers_total",
               "KV transfers by mode and the decoding instance's kv_transfer_result status",
               {{"mode", std::string(policy::modeName(mode))}, {"status", status}})
      .inc();
  if (ctx.transfer) {
    registry_.counter("kvfabric_router_kv_pushed_tokens_total", "Tokens of KV pushed to decoders")
        .inc(static_cast<double>(ctx.transfer->pushed_tokens));
    registry_.counter("kvfabric_router_kv_pushed_bytes_total", "Bytes of KV pushed to decoders")
        .inc(static_cast<double>(ctx.transfer->pushed_bytes));
  }
}

}  // namespace kvf::router
