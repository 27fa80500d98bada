// KV push inside the live engine, receiver side: for each request the core parked in
// kWaitingForRemoteKv, learn the source worker's transport address (GET /kv/info, cached),
// expect a put into the landing blocks (prefix allowed, checksums verified), ask the source to
// push (POST /kv/push) within a deadline, let the modelled link time pass (the push costs
// max(real, modelled)), verify the deterministic payload on the core thread and complete or
// fail the fetch there. Landing blocks a late write may still reach stay quarantined in the
// core until the transport resolves the landing. HTTP thread, except the core-thread lambdas.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/engine_server_impl.h"
#include "transport/asio_completion.h"
#include "transport/base64.h"
#include "worker/block_payload.h"

namespace kvf::engine {

using detail::kAwait;
using detail::steadyNanos;
using detail::toTimePoint;
namespace kt = kvf::transport;
namespace bj = boost::json;

namespace {

constexpr Nanos kMs = 1'000'000;

// "http://host:port" (an optional trailing slash) -> host, port.
absl::StatusOr<std::pair<std::string, uint16_t>> parseWorkerUrl(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  auto bad = [&] {
    return absl::InvalidArgumentError(
        strCat("kv_transfer_params.source: expected http://host:port, got '", url, "'"));
  };
  if (!url.starts_with(kScheme)) return bad();
  std::string_view rest = url.substr(kScheme.size());
  if (rest.ends_with('/')) rest.remove_suffix(1);
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == rest.size()) return bad();
  int port = 0;
  for (char c : rest.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) return bad();
    port = port * 10 + (c - '0');
  }
  if (port < 1 || port > 65535) return bad();
  return std::make_pair(std::string(rest.substr(0, colon)), static_cast<uint16_t>(port));
}

std::chrono::milliseconds msUntil(Nanos deadline_wall) {
  return std::chrono::milliseconds(std::max<Nanos>(1, (deadline_wall - steadyNanos()) / kMs));
}

}  // namespace

absl::Status EngineServer::Impl::applyKvTransfer(const KvTransferParams& k,
                                                 RequestSpec& spec) const {
  if (!worker_http) {
    return absl::InvalidArgumentError(
        "kv_transfer_params: this engine has no worker control server (--worker_port)");
  }
  if (k.do_remote_decode) {
    int64_t lease_ms = k.lease_ms > 0 ? k.lease_ms : config.worker.default_lease_ms;
    if (lease_ms > config.worker.max_lease_ms) {
      return absl::InvalidArgumentError(
          strCat("kv_transfer_params.lease_ms: at most ", config.worker.max_lease_ms));
    }
    // The lease runs on the engine clock (time_scale x wall time).
    spec.remote_decode_lease =
        static_cast<Nanos>(static_cast<double>(lease_ms * kMs) * config.time_scale);
    spec.sampling.max_tokens = 1;  // prefill and one token; decode happens elsewhere
    spec.sampling.min_tokens = 0;
    return absl::OkStatus();
  }
  KVF_RETURN_IF_ERROR(parseWorkerUrl(k.source).status());
  RemoteKvSpec remote;
  remote.source = k.source;
  if (k.block_hashes) remote.block_hashes = *k.block_hashes;
  spec.remote_kv = std::move(remote);
  return absl::OkStatus();
}

bj::value EngineServer::Impl::leaseParams(const Pending& p) const {
  KvTransferParams params;
  params.source = workerUrl();
  params.block_hashes = p.lease_block_hashes;
  params.lease_id = *p.lease_id;
  return protocol::kvTransferParamsJson(params);
}

void EngineServer::Impl::startFetch(RemoteKvFetch fetch) {
  asio::co_spawn(ioc, runFetch(std::move(fetch)), asio::detached);
}

asio::awaitable<absl::StatusOr<std::shared_ptr<SourceWorker>>> EngineServer::Impl::sourceWorker(
    const std::string& url, Nanos deadline_wall) {
  auto it = sources.find(url);
  if (it == sources.end()) {
    KVF_CO_ASSIGN_OR_RETURN(auto hp, parseWorkerUrl(url));
    http::ClientOptions co;
    co.connect_timeout = std::chrono::milliseconds(config.worker.push_deadline_cap_ms);
    co.max_body_bytes = 64 * push_limits.max_blocks + (1 << 20);
    auto sw = std::make_shared<SourceWorker>();
    sw->client = http::HttpClient::create(ioc.get_executor(), hp.first, hp.second, co);
    it = sources.emplace(url, std::move(sw)).first;
  }
  std::shared_ptr<SourceWorker> sw = it->second;
  if (sw->info) co_return sw;
  http::ClientRequest req;
  req.method = "GET";
  req.target = "/kv/info";
  if (!worker_token.empty()) req.headers.emplace_back("authorization", "Bearer " + worker_token);
  req.read_timeout = msUntil(deadline_wall);
  auto resp = co_await sw->client->request(std::move(req));
  if (!resp.ok()) co_return resp.status();
  if (resp->status != 200) {
    co_return absl::UnavailableError(strCat("GET /kv/info: HTTP ", resp->status));
  }
  KVF_CO_ASSIGN_OR_RETURN(protocol::WorkerInfo info,
                          protocol::parseWorkerInfo(resp->body, push_limits));
  KVF_CO_ASSIGN_OR_RETURN(sw->transport_address,
                          kt::base64Decode(info.transport_address, push_limits.max_blob_bytes));
  sw->info = std::move(info);
  co_return sw;
}

asio::awaitable<TransferOutcome> EngineServer::Impl::transferBlocks(const RemoteKvFetch& f,
                                                                    const FetchOptions& opt,
                                                                    Nanos deadline_wall) {
  TransferOutcome out;
  const uint64_t bytes = config.cache.payload_bytes_per_block;
  auto sw = co_await sourceWorker(opt.source, deadline_wall);
  if (!sw.ok()) {
    out.reason = strCat("source worker: ", std::string(sw.status().message()));
    co_return out;  // no landing: nothing can be written
  }
  const protocol::WorkerInfo& info = *(*sw)->info;
  if (info.block_bytes != bytes || info.block_size != config.cache.block_size) {
    out.reason = strCat("source blocks are ", info.block_size, " tokens / ", info.block_bytes,
                        " bytes, ours ", config.cache.block_size, " / ", bytes);
    co_return out;
  }
  kt::LandingSpec spec;
  spec.sender_address = (*sw)->transport_address;
  for (BlockIndex b : f.blocks) spec.blocks.push_back({0, pool_region->base() + b * bytes, bytes});
  spec.deadline = msUntil(deadline_wall);
  spec.verify_checksums = true;
  spec.allow_prefix = true;
  auto signal = std::make_shared<asio::steady_timer>(ioc, detail::Steady::time_point::max());
  auto landed = std::make_shared<std::optional<absl::Status>>();
  auto on_landed = [signal, landed](absl::Status s) {
    *landed = std::move(s);
    signal->cancel();
  };
  auto landing =
      transport->expectPut(pool_region, spec, kt::onExecutor(ioc.get_executor(), on_landed));
  if (!landing.ok()) {
    out.reason = strCat("expectPut: ", std::string(landing.status().message()));
    co_return out;
  }
  out.landing = *landing;

  protocol::PushRequest pr;
  pr.request_id = f.id;
  pr.block_hashes = f.hashes;
  pr.receiver_address = kt::base64Encode(transport->workerAddress());
  pr.rkey = kt::base64Encode(pool_region->packedRkey());
  for (const auto& b : spec.blocks) pr.block_addrs.push_back(b.remote_addr);
  pr.block_bytes = bytes;
  pr.landing_id = (*landing)->id();
  pr.deadline_ms = msUntil(deadline_wall).count();
  pr.lease_id = opt.lease_id;
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/kv/push";
  req.body = protocol::serializePushRequest(pr);
  if (!worker_token.empty()) req.headers.emplace_back("authorization", "Bearer " + worker_token);
  req.read_timeout = msUntil(deadline_wall);
  auto resp = co_await (*sw)->client->request(std::move(req));
  std::optional<protocol::PushResponse> answer;
  bool no_put = false;  // the source says it posted nothing: the landing can be dismissed
  if (!resp.ok()) {
    out.reason = strCat("POST /kv/push: ", std::string(resp.status().message()));
  } else if (resp->status != 200) {
    no_put = resp->status >= 400 && resp->status < 500;  // refused before any put
    out.reason = strCat("POST /kv/push: HTTP ", resp->status, " ", resp->body.substr(0, 200));
  } else if (auto parsed = protocol::parsePushResponse(resp->body, push_limits); !parsed.ok()) {
    out.reason = strCat("POST /kv/push answer: ", std::string(parsed.status().message()));
  } else {
    answer = std::move(*parsed);
    no_put = !answer->put_issued;
    if (!answer->error.empty()) out.reason = strCat("source: ", answer->error);
  }
  if (no_put && !landed->has_value()) (*landing)->dismiss();
  bool cancelled = false;
  while (!landed->has_value()) {  // the landing's own deadline ends this at the latest
    signal->expires_at(toTimePoint(cancelled ? steadyNanos() + 1000 * kMs : deadline_wall));
    co_await signal->async_wait(kAwait);
    if (!landed->has_value() && !cancelled && steadyNanos() >= deadline_wall) {
      (*landing)->cancel();
      cancelled = true;
    }
  }
  const absl::Status& status = **landed;
  if (status.ok()) {
    out.landed = (*landing)->landedBlocks();
    if (answer && (answer->pushed_hashes.size() != out.landed ||
                   !std::equal(answer->pushed_hashes.begin(), answer->pushed_hashes.end(),
                               f.hashes.begin()))) {
      out.reason = "the source's answer does not match what landed";
      out.landed = 0;
    } else if (out.landed < f.hashes.size()) {
      out.reason = strCat("source held ", out.landed, " of ", f.hashes.size(), " blocks");
    }
  } else if (out.reason.empty() || status.code() != absl::StatusCode::kCancelled || !no_put) {
    out.reason = out.reason.empty()
                     ? std::string(status.message())
                     : strCat(out.reason, "; landing: ", std::string(status.message()));
  }
  if (no_put && answer && answer->pushed_hashes.empty() && answer->error.empty()) {
    out.reason = "source holds none of the blocks";
  }
  out.bytes = out.landed * bytes;
  out.writes_may_arrive = !(*landing)->resolved();
  if (!status.ok() || !resp.ok()) sources.erase(opt.source);  // re-learn it next time
  co_return out;
}

asio::awaitable<void> EngineServer::Impl::runFetch(RemoteKvFetch f) {
  FetchOptions opt;
  if (auto it = fetch_options.find(f.id); it != fetch_options.end()) {
    opt = std::move(it->second);
    fetch_options.erase(it);
  } else {
    opt.source = f.source;
  }
  const Nanos t0 = steadyNanos();
  const int64_t bs = config.cache.block_size;
  const TimingModel& timing = core->timing();  // immutable: safe from this thread
  auto wall = [this](Nanos engine) {
    return static_cast<Nanos>(static_cast<double>(engine) / config.time_scale);
  };
  const auto n = static_cast<int64_t>(f.hashes.size());
  Nanos deadline = opt.deadline_ms * kMs;
  if (deadline <= 0) {
    deadline = std::min(
        config.worker.push_deadline_cap_ms * kMs,
        wall(timing.transferDuration(n * bs)) + config.worker.push_deadline_margin_ms * kMs);
  }
  TransferOutcome out = co_await transferBlocks(f, opt, t0 + deadline);
  // The modelled link: the push costs max(real transport time, modelled time).
  const Nanos modelled_end =
      t0 + wall(timing.transferDuration(static_cast<int64_t>(out.landed) * bs));
  Nanos kv_ready_at = -1;
  if (out.landed > 0 && config.worker.layerwise) {
    kv_ready_at = engineNow(modelled_end);  // overlaps the first step (see engine_core.h)
  } else if (out.landed > 0) {
    asio::steady_timer link(ioc);  // the whole modelled transfer before the request runs
    link.expires_at(toTimePoint(modelled_end));
    co_await link.async_wait(kAwait);
  }
  const bool resolved = !out.landing || out.landing->resolved();
  struct Verdict {
    size_t good = 0;
    std::string problem;
  };
  auto finish = [this, &f, landed = out.landed, may = out.writes_may_arrive, resolved,
                 kv_ready_at]() -> asio::awaitable<Verdict> {
    Verdict v{landed, {}};
    for (size_t i = 0; i < landed; ++i) {  // the emulator's content is a function of the hash
      if (!worker::verifyBlockPayload(f.hashes[i], core->pool().payload(f.blocks[i]))) {
        v.problem = strCat("block ", i, " landed with content that does not match its hash");
        v.good = 0;
        break;
      }
    }
    Nanos now = engineNow(steadyNanos());
    // With a landing that completed, no write can arrive (may is false then).
    absl::Status st = v.good > 0 ? core->completeRemoteKv(f.id, v.good, now, kv_ready_at)
                                 : core->failRemoteKv(f.id, now, may);
    if (resolved) core->releaseRemoteKvLanding(f.id);  // an abort may have quarantined them
    publishStats();
    if (idle) wake_timer.cancel();
    if (!st.ok() && st.code() != absl::StatusCode::kNotFound) v.problem = std::string(st.message());
    co_return v;
  };
  // Runs before the core can produce the request's first token, and this coroutine resumes
  // before that token is delivered (both are posted to this thread, in order).
  Verdict v = co_await asio::co_spawn(core_ioc, finish, asio::use_awaitable);
  const size_t good = v.good;
  std::string reason = v.problem.empty() ? out.reason : v.problem;
  const protocol::TransferOutcome outcome = protocol::transferOutcomeFor(good, f.hashes.size());
  (outcome == protocol::TransferOutcome::kFallback  ? pm.fetch_fallback
   : outcome == protocol::TransferOutcome::kPartial ? pm.fetch_partial
                                                    : pm.fetch_ok)
      ->inc();
  pm.tokens_in->inc(static_cast<double>(good) * static_cast<double>(bs));
  pm.bytes_in->inc(static_cast<double>(good * config.cache.payload_bytes_per_block));
  pm.fetch_seconds->observe(nanosToSeconds(steadyNanos() - t0));
  if (good == 0) {
    log::info("kv push fallback", "request", f.id, "source", opt.source, "blocks", n, "reason",
              reason);
  }
  if (auto it = pending.find(f.id); it != pending.end()) {
    KvTransferResult r;
    r.outcome = outcome;
    r.pushed_tokens = static_cast<int64_t>(good) * bs;
    r.pushed_bytes = static_cast<int64_t>(good * config.cache.payload_bytes_per_block);
    r.requested_tokens = n * bs;
    r.reason = reason;
    it->second->kv_transfer_result = std::move(r);
  }
  if (!resolved) co_await releaseWhenResolved(f.id, out.landing);
}

asio::awaitable<void> EngineServer::Impl::releaseWhenResolved(
    std::string id, std::shared_ptr<transport::Landing> landing) {
  // Until the sender's late notice arrives or the sender is gone, a write may still land in
  // the quarantined blocks; only then do they go back to the pool.
  asio::steady_timer poll(ioc);
  Nanos start = steadyNanos();
  bool warned = false;
  while (!landing->resolved()) {
    poll.expires_after(std::chrono::milliseconds(20));
    co_await poll.async_wait(kAwait);
    if (!warned && steadyNanos() - start > 60 * kNanosPerSecond) {
      log::warn("kv push landing still unresolved after 60 s; its blocks stay quarantined",
                "request", id);
      warned = true;
    }
  }
  auto release = [this, id]() -> asio::awaitable<void> {
    core->releaseRemoteKvLanding(id);
    publishStats();
    if (idle) wake_timer.cancel();
    co_return;
  };
  co_await asio::co_spawn(core_ioc, release, asio::use_awaitable);
}

}  // namespace kvf::engine
