// WorkerAgent, receiver side of KV push: learn the holder's transport address (GET /kv/info),
// expect the put into the engine's landing blocks, ask the holder to push (POST /kv/push), wait
// for the landing within the fetch's deadline, report the outcome to the engine, and hand the
// landing back once no late write can reach it. Every failure on the way ends in a fallback
// outcome within the deadline: a fetch never leaves the engine waiting.
#include <algorithm>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "protocol/openai.h"
#include "transport/asio_completion.h"
#include "transport/base64.h"
#include "worker/agent_internal.h"

namespace kvf::worker {

using agent_internal::kAwait;
using agent_internal::kMs;
using agent_internal::msUntil;
using agent_internal::SourceWorker;
using agent_internal::Steady;
using agent_internal::steadyNanos;
using agent_internal::toTimePoint;
using agent_internal::TransferResult;
namespace kt = kvf::transport;

namespace {

// "http://host:port" (an optional trailing slash) -> host, port.
absl::StatusOr<std::pair<std::string, uint16_t>> parseWorkerUrl(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  auto bad = [&] {
    return absl::InvalidArgumentError(strCat("source: expected http://host:port, got '", url, "'"));
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

log::RateLimitedLog fallback_log;

}  // namespace

absl::Status validateWorkerUrl(std::string_view url) { return parseWorkerUrl(url).status(); }

absl::StatusOr<std::shared_ptr<SourceWorker>> WorkerAgent::Impl::workerAt(const std::string& url) {
  constexpr size_t kMaxPeers = 4096;  // far above a cluster's engines; URLs come from peers
  auto it = sources.find(url);
  if (it != sources.end()) return it->second;
  KVF_ASSIGN_OR_RETURN(auto hp, parseWorkerUrl(url));
  if (sources.size() >= kMaxPeers) sources.clear();  // in-flight users hold their own reference
  http::ClientOptions co;
  co.connect_timeout = options.connect_timeout;
  co.max_body_bytes = 64 * limits.max_blocks + (1 << 20);
  auto sw = std::make_shared<SourceWorker>();
  sw->client = http::HttpClient::create(ioc.get_executor(), hp.first, hp.second, co);
  sources.emplace(url, sw);
  return sw;
}

asio::awaitable<absl::StatusOr<std::shared_ptr<SourceWorker>>> WorkerAgent::Impl::sourceWorker(
    const std::string& url, Nanos deadline) {
  KVF_CO_ASSIGN_OR_RETURN(std::shared_ptr<SourceWorker> sw, workerAt(url));
  if (sw->info) co_return sw;
  http::ClientRequest req = peerRequest("GET", "/kv/info", "", msUntil(deadline));
  auto resp = co_await sw->client->request(std::move(req));
  if (!resp.ok()) co_return resp.status();
  if (resp->status != 200) {
    co_return absl::UnavailableError(strCat("GET /kv/info: HTTP ", resp->status));
  }
  KVF_CO_ASSIGN_OR_RETURN(protocol::WorkerInfo info, protocol::parseWorkerInfo(resp->body, limits));
  KVF_CO_ASSIGN_OR_RETURN(sw->transport_address,
                          kt::base64Decode(info.transport_address, limits.max_blob_bytes));
  sw->info = std::move(info);
  co_return sw;
}

asio::awaitable<TransferResult> WorkerAgent::Impl::transferBlocks(const RemoteKvFetch& f,
                                                                  Nanos deadline) {
  TransferResult out;
  const uint64_t bytes = geometry.block_bytes;
  auto sw = co_await sourceWorker(f.source, deadline);
  if (!sw.ok()) {
    out.reason = strCat("source worker: ", std::string(sw.status().message()));
    sources.erase(f.source);  // re-learn it next time
    co_return out;            // no landing: nothing can be written
  }
  const protocol::WorkerInfo& info = *(*sw)->info;
  if (info.block_bytes != bytes || info.block_size != geometry.block_size) {
    out.reason = strCat("source blocks are ", info.block_size, " tokens / ", info.block_bytes,
                        " bytes, ours ", geometry.block_size, " / ", bytes);
    co_return out;
  }
  kt::LandingSpec spec;
  spec.sender_address = (*sw)->transport_address;
  for (BlockIndex b : f.blocks) spec.blocks.push_back({0, pool_region->base() + b * bytes, bytes});
  spec.deadline = msUntil(deadline);
  spec.verify_checksums = true;
  spec.allow_prefix = true;
  auto signal = std::make_shared<asio::steady_timer>(ioc, Steady::time_point::max());
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
  const uint64_t landing_id = (*landing)->id();
  agent_internal::OpenLanding open;
  for (const auto& b : spec.blocks) open.block_addrs.push_back(b.remote_addr);
  open_landings.emplace(landing_id, std::move(open));

  protocol::PushRequest pr;
  pr.request_id = f.id;
  pr.receiver_url = advertisedUrl();
  pr.block_hashes = f.hashes;
  pr.receiver_address = kt::base64Encode(transport->workerAddress());
  pr.rkey = kt::base64Encode(pool_region->packedRkey());
  for (const auto& b : spec.blocks) pr.block_addrs.push_back(b.remote_addr);
  pr.block_bytes = bytes;
  pr.landing_id = landing_id;
  pr.deadline_ms = msUntil(deadline).count();
  pr.lease_id = f.lease_id;
  http::ClientRequest req =
      peerRequest("POST", "/kv/push", protocol::serializePushRequest(pr), msUntil(deadline));
  auto resp = co_await (*sw)->client->request(std::move(req));
  // Closed to claims from now on. A holder writes only after its claim was granted, so an
  // unclaimed landing can receive no write: it is dismissed below instead of quarantined.
  auto closed = open_landings.extract(landing_id);
  const bool claimed = !closed.empty() && closed.mapped().claimed;
  std::optional<protocol::PushResponse> answer;
  bool no_put = false;  // the source says it posted nothing: the landing can be dismissed
  if (!resp.ok()) {
    out.reason = strCat("POST /kv/push: ", std::string(resp.status().message()));
  } else if (resp->status != 200) {
    no_put = resp->status >= 400 && resp->status < 500;  // refused before any put
    out.reason = strCat("POST /kv/push: HTTP ", resp->status, " ", resp->body.substr(0, 200));
  } else if (auto parsed = protocol::parsePushResponse(resp->body, limits); !parsed.ok()) {
    out.reason = strCat("POST /kv/push answer: ", std::string(parsed.status().message()));
  } else {
    answer = std::move(*parsed);
    no_put = !answer->put_issued;
    if (!answer->error.empty()) out.reason = strCat("source: ", answer->error);
  }
  if (!claimed) {
    no_put = true;
    if (!(*landing)->resolved()) (*landing)->dismiss();  // even after its deadline passed
  } else if (no_put && !landed->has_value()) {
    (*landing)->dismiss();
  }
  bool cancelled = false;
  while (!landed->has_value()) {  // the landing's own deadline ends this at the latest
    signal->expires_at(toTimePoint(cancelled ? steadyNanos() + 1000 * kMs : deadline));
    co_await signal->async_wait(kAwait);
    if (!landed->has_value() && !cancelled && steadyNanos() >= deadline) {
      (*landing)->cancel();
      cancelled = true;
    }
  }
  const absl::Status& status = **landed;
  if (status.ok()) {
    out.landed = std::min<size_t>((*landing)->landedBlocks(), f.hashes.size());
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
  if (!status.ok() || !resp.ok()) sources.erase(f.source);  // re-learn it next time
  co_return out;
}

asio::awaitable<void> WorkerAgent::Impl::runFetch(RemoteKvFetch f) {
  const Nanos t0 = steadyNanos();
  RemoteKvOutcome outcome;
  outcome.id = f.id;
  outcome.requested = f.hashes.size();
  TransferResult result;
  if (f.hashes.empty() || f.hashes.size() != f.blocks.size()) {
    result.reason =
        strCat("fetch: ", f.hashes.size(), " hashes for ", f.blocks.size(), " landing blocks");
  } else if (f.hashes.size() > limits.max_blocks) {
    result.reason =
        strCat("fetch: ", f.hashes.size(), " blocks exceed max_push_blocks ", limits.max_blocks);
  } else if (auto bad = std::find_if(f.blocks.begin(), f.blocks.end(),
                                     [&](BlockIndex b) { return b >= geometry.num_blocks; });
             bad != f.blocks.end()) {
    result.reason = strCat("fetch: landing block ", *bad, " is outside the pool of ",
                           geometry.num_blocks, " blocks");
  } else {
    const Nanos deadline = t0 + std::max<Nanos>(1, f.deadline.count()) * kMs;
    if (f.nixl) {
      result = co_await readNixlBlocks(f, deadline);
    } else {
      result = co_await transferBlocks(f, deadline);
    }
  }
  outcome.landed = result.landed;
  outcome.bytes = result.bytes;
  outcome.reason = std::move(result.reason);
  outcome.writes_may_arrive = result.writes_may_arrive;
  outcome.elapsed = steadyNanos() - t0;
  switch (protocol::transferOutcomeFor(outcome.landed, outcome.requested)) {
    case protocol::TransferOutcome::kOk:
      m.fetch_ok->inc();
      break;
    case protocol::TransferOutcome::kPartial:
      m.fetch_partial->inc();
      break;
    default:
      m.fetch_fallback->inc();
      fallback_log.warn("kv fetch fell back", "fetch", f.id, "source", f.source, "blocks",
                        f.hashes.size(), "reason", outcome.reason);
  }
  m.bytes_in->inc(static_cast<double>(outcome.bytes));
  m.fetch_seconds->observe(nanosToSeconds(outcome.elapsed));
  if (outcome.writes_may_arrive) unresolved_landings.fetch_add(1);
  adapter.post([this, outcome] {
    if (outcome.landed > 0) {
      adapter.completeRemoteKv(outcome);
    } else {
      adapter.failRemoteKv(outcome);
    }
  });
  if (outcome.writes_may_arrive) co_await awaitResolved(f.id, std::move(result));
  adapter.post([this, id = f.id] { adapter.releaseLanding(id); });
}

asio::awaitable<void> WorkerAgent::Impl::awaitResolved(std::string id, TransferResult result) {
  // Until the sender's late notice arrives or the sender is gone (push), or our abandoned reads
  // drained (NIXL), a write may still land in the quarantined blocks; only then do they go back
  // to the engine.
  auto resolved = [&] {
    return result.landing ? result.landing->resolved() : !result.get || result.get->drained();
  };
  asio::steady_timer poll(ioc);
  Nanos start = steadyNanos();
  bool warned = false;
  while (!resolved()) {
    poll.expires_after(std::chrono::milliseconds(20));
    co_await poll.async_wait(kAwait);
    if (!warned && steadyNanos() - start > 60 * kNanosPerSecond) {
      log::warn("kv push landing still unresolved after 60 s; its blocks stay quarantined", "fetch",
                id);
      warned = true;
    }
  }
  unresolved_landings.fetch_sub(1);
}

}  // namespace kvf::worker
