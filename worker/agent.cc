// WorkerAgent: setup, the control server (authentication, GET /kv/info, POST /kv/push parsing)
// and leases. The holder's push is in push_holder.cc, the receiver's fetch in push_receiver.cc.
#include "worker/agent.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "transport/base64.h"
#include "transport/transport_metrics.h"
#include "worker/agent_internal.h"

namespace kvf::worker {

using agent_internal::kAwait;
using agent_internal::steadyNanos;

absl::StatusOr<std::unique_ptr<WorkerAgent>> WorkerAgent::create(
    asio::io_context& ioc, EngineAdapter& adapter,
    std::unique_ptr<transport::TransportContext> transport, AgentOptions options,
    metrics::Registry* registry) {
  if (transport == nullptr) return absl::InvalidArgumentError("transport: none given");
  auto impl = std::make_unique<Impl>(ioc, adapter, std::move(transport), std::move(options));
  const BlockGeometry& g = impl->geometry;
  const PayloadRegion region = adapter.payloadRegion();
  if (g.block_size < 1 || g.block_bytes == 0 || g.num_blocks == 0) {
    return absl::InvalidArgumentError(strCat("block geometry: ", g.block_size, " tokens, ",
                                             g.block_bytes, " bytes, ", g.num_blocks,
                                             " blocks; each must be positive"));
  }
  if (region.data == nullptr || region.length / g.block_bytes < g.num_blocks) {
    return absl::InvalidArgumentError(strCat("payload region: ", region.length,
                                             " bytes cannot hold ", g.num_blocks, " blocks of ",
                                             g.block_bytes, " bytes"));
  }
  if (impl->options.max_push_blocks < 1) {
    return absl::InvalidArgumentError("max_push_blocks: must be positive");
  }
  impl->limits.max_blocks = impl->options.max_push_blocks;
  if (impl->options.token.empty()) {
    if (!impl->options.insecure) {
      return absl::InvalidArgumentError(
          "token: the worker API needs a bearer token (any peer could otherwise push into and "
          "pull from this engine's KV memory); set insecure to run it without one (test only)");
    }
    log::warn("worker control server runs WITHOUT authentication (insecure: test only)");
  }
  const std::string& host = impl->options.host;
  if (impl->options.advertise_url.empty() && (host == "0.0.0.0" || host == "::")) {
    log::warn(
        "worker bound to a wildcard address without advertise_url: holders on other hosts "
        "cannot claim this engine's landings (it names 127.0.0.1), so pushes to it fall back",
        "host", host);
  }
  KVF_ASSIGN_OR_RETURN(impl->pool_region,
                       impl->transport->registerMemory(region.data, region.length));
  KVF_RETURN_IF_ERROR(impl->prepareTierPush());
  http::ServerOptions so;
  so.host = impl->options.host;
  so.port = impl->options.port;
  so.max_body_bytes = 64 * impl->limits.max_blocks + (1 << 20);  // two u64 arrays + blobs
  KVF_ASSIGN_OR_RETURN(impl->server, http::HttpServer::create(ioc, so));
  impl->registerRoutes();
  impl->registerMetrics(registry != nullptr ? *registry : impl->own_registry);
  if (!impl->options.fault.empty()) {
    log::warn("worker fault injection is ON (test only)", "fault", impl->options.fault);
  }
  return std::unique_ptr<WorkerAgent>(new WorkerAgent(std::move(impl)));
}

WorkerAgent::WorkerAgent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WorkerAgent::~WorkerAgent() {
  // A disk read still filling the bounce region must finish before the transport frees it; the
  // tiers' reads are bounded by the disk, so this waits a short while at most.
  const Nanos give_up = steadyNanos() + 5 * kNanosPerSecond;
  while (impl_->tier_reads_in_flight->load() > 0 && steadyNanos() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

absl::Status WorkerAgent::Impl::prepareTierPush() {
  const PayloadRegion tiers = adapter.tierRegion();
  if (tiers.data == nullptr || tiers.length == 0) return absl::OkStatus();
  KVF_ASSIGN_OR_RETURN(tier_region, transport->registerMemory(tiers.data, tiers.length));
  bounce = std::make_shared<agent_internal::BouncePool>();
  bounce_stride = tierPushBufferStride(geometry.block_bytes);
  const uint64_t blocks = std::min<uint64_t>(options.push_bounce_bytes / bounce_stride, 1 << 20);
  if (blocks == 0) return absl::OkStatus();
  KVF_ASSIGN_OR_RETURN(bounce_region, transport->allocateMemory(blocks * bounce_stride));
  for (uint64_t i = blocks; i-- > 0;) bounce->free.push_back(static_cast<uint32_t>(i));
  return absl::OkStatus();
}

void WorkerAgent::start() {
  impl_->server->start();
  asio::co_spawn(impl_->ioc, impl_->leaseLoop(), asio::detached);
}

void WorkerAgent::stop() {
  impl_->stopping = true;
  impl_->lease_timer.cancel();
  impl_->server->stop();
}

uint16_t WorkerAgent::port() const { return impl_->server->port(); }

std::string WorkerAgent::url() const { return impl_->advertisedUrl(); }

std::string WorkerAgent::Impl::advertisedUrl() const {
  if (!options.advertise_url.empty()) return options.advertise_url;
  const std::string& host = options.host;
  return strCat("http://", host == "0.0.0.0" ? "127.0.0.1" : host, ":", server->port());
}

transport::TransportContext& WorkerAgent::transport() { return *impl_->transport; }

void WorkerAgent::fetch(RemoteKvFetch fetch) {
  Impl* impl = impl_.get();
  asio::post(impl->ioc, [impl, fetch = std::move(fetch)]() mutable {
    asio::co_spawn(impl->ioc, impl->runFetch(std::move(fetch)), asio::detached);
  });
}

std::vector<BlockHash> WorkerAgent::holdLease(const std::string& lease_id,
                                              std::span<const BlockHash> hashes, Nanos ttl) {
  std::vector<BlockIndex> pinned = impl_->adapter.pinLeadingRun(hashes);
  Lease lease;
  lease.hashes.assign(hashes.begin(), hashes.begin() + static_cast<std::ptrdiff_t>(pinned.size()));
  lease.expires_at = impl_->adapter.now() + ttl;
  std::vector<BlockHash> run = lease.hashes;
  adoptLease(lease_id, std::move(lease));
  return run;
}

void WorkerAgent::adoptLease(const std::string& lease_id, Lease lease) {
  std::vector<BlockHash> replaced = impl_->leases.take(lease_id, std::move(lease));
  if (!replaced.empty()) impl_->adapter.unpin(replaced);
  impl_->publishLeaseCounts();
}

void WorkerAgent::releaseLease(const std::string& lease_id) { impl_->releaseLease(lease_id); }

size_t WorkerAgent::leaseCount() const { return impl_->lease_count.load(); }

size_t WorkerAgent::leasedBlocks() const { return impl_->leased_blocks.load(); }

bool WorkerAgent::authorized(const http::Request& head) const { return impl_->authorized(head); }

void WorkerAgent::Impl::releaseLease(const std::string& lease_id) {
  std::optional<std::vector<BlockHash>> hashes = leases.release(lease_id);
  if (hashes && !hashes->empty()) adapter.unpin(*hashes);
  publishLeaseCounts();
}

asio::awaitable<void> WorkerAgent::Impl::leaseLoop() {
  while (!stopping) {
    lease_timer.expires_after(options.lease_check_interval);
    co_await lease_timer.async_wait(kAwait);
    if (stopping) break;
    if (lease_count.load() == 0) continue;
    adapter.post([this] {
      for (const Lease& lease : leases.expire(adapter.now())) {
        if (!lease.hashes.empty()) adapter.unpin(lease.hashes);
        m.leases_expired->inc();
      }
      publishLeaseCounts();
    });
  }
}

void WorkerAgent::Impl::registerMetrics(metrics::Registry& registry) {
  const metrics::Labels& labels = options.metric_labels;
  auto with = [&](const char* key, const char* value) {
    metrics::Labels l = labels;
    l.emplace_back(key, value);
    return l;
  };
  const char* served = "kvfabric_worker_push_served_total";
  const char* served_help = "POST /kv/push answered by outcome (ok, empty, failed)";
  m.served_ok = &registry.counter(served, served_help, with("outcome", "ok"));
  m.served_empty = &registry.counter(served, served_help, with("outcome", "empty"));
  m.served_failed = &registry.counter(served, served_help, with("outcome", "failed"));
  m.bytes_out = &registry.counter("kvfabric_worker_push_sent_bytes_total",
                                  "Payload bytes pushed to peers", labels);
  m.serve_seconds =
      &registry.histogram("kvfabric_worker_push_seconds", "Holder time per push (wall)",
                          metrics::exponentialBuckets(1e-5, 2, 18), labels);
  const char* by_tier = "kvfabric_worker_push_blocks_total";
  const char* by_tier_help =
      "Blocks pushed to peers by the tier that served them (gpu: the engine's pool, cpu: host "
      "memory, disk: local disk)";
  m.pushed_gpu = &registry.counter(by_tier, by_tier_help, with("tier", "gpu"));
  m.pushed_cpu = &registry.counter(by_tier, by_tier_help, with("tier", "cpu"));
  m.pushed_disk = &registry.counter(by_tier, by_tier_help, with("tier", "disk"));
  m.bounce_full = &registry.counter(
      "kvfabric_worker_push_bounce_full_total",
      "Pushes that left disk blocks missing because the bounce region was full", labels);
  const char* fetches = "kvfabric_worker_fetches_total";
  const char* fetch_help = "Fetches from holders by what landed (ok, partial, fallback)";
  m.fetch_ok = &registry.counter(fetches, fetch_help, with("outcome", "ok"));
  m.fetch_partial = &registry.counter(fetches, fetch_help, with("outcome", "partial"));
  m.fetch_fallback = &registry.counter(fetches, fetch_help, with("outcome", "fallback"));
  m.bytes_in = &registry.counter("kvfabric_worker_fetched_bytes_total",
                                 "Payload bytes landed from holders", labels);
  m.fetch_seconds = &registry.histogram("kvfabric_worker_fetch_seconds",
                                        "Fetch time from request to outcome (wall)",
                                        metrics::exponentialBuckets(1e-4, 2, 16), labels);
  const char* refused = "kvfabric_worker_push_refused_total";
  const char* refused_help =
      "POST /kv/push refused before any write, by reason (receiver not a configured peer, "
      "landing not granted by the receiver, request differs from the receiver's landing)";
  m.refused_not_a_peer = &registry.counter(refused, refused_help, with("reason", "not_a_peer"));
  m.refused_not_granted = &registry.counter(refused, refused_help, with("reason", "not_granted"));
  m.refused_mismatch = &registry.counter(refused, refused_help, with("reason", "mismatch"));
  const char* claims = "kvfabric_worker_claims_refused_total";
  const char* claims_help =
      "POST /kv/claim refused, by reason (no such outstanding landing, already claimed)";
  m.claim_unknown = &registry.counter(claims, claims_help, with("reason", "unknown"));
  m.claim_repeated = &registry.counter(claims, claims_help, with("reason", "claimed"));
  m.leases_expired = &registry.counter("kvfabric_worker_leases_expired_total",
                                       "Remote-decode leases that expired unused", labels);
  m.nixl_meta_served = &registry.counter(
      "kvfabric_worker_nixl_meta_total",
      "NixlConnector side-channel metadata requests answered (each one a lease heartbeat)", labels);
  m.nixl_notified =
      &registry.counter("kvfabric_worker_nixl_notify_total",
                        "NixlConnector read notifications that ended a lease", labels);
  const char* nixl_refused = "kvfabric_worker_nixl_refused_total";
  const char* nixl_refused_help =
      "NixlConnector side-channel requests refused: they named no live lease (unknown, expired "
      "or already released)";
  m.nixl_meta_refused = &registry.counter(nixl_refused, nixl_refused_help, with("route", "meta"));
  m.nixl_notify_refused =
      &registry.counter(nixl_refused, nixl_refused_help, with("route", "notify"));
  registry.callback("kvfabric_worker_unresolved_landings",
                    "Fetches whose landing a late write may still reach",
                    metrics::MetricType::kGauge, labels,
                    [this] { return static_cast<double>(unresolved_landings.load()); });
  transport::exportMetrics(*transport, registry, labels);
}

void WorkerAgent::Impl::registerRoutes() {
  // The token is checked on the request head, before any body byte is read: an
  // unauthenticated peer costs no body buffer (a push body may be megabytes). The NIXL side
  // channel (/kv/nixl/*) sits behind the same check.
  http::HeadCheck auth = [this](const http::Request& head) {
    return authorized(head) ? absl::OkStatus()
                            : absl::UnauthenticatedError("missing or wrong bearer token");
  };
  struct Route {
    const char* method;
    const char* target;
    asio::awaitable<void> (Impl::*handler)(const http::Request&, http::ResponseWriter&);
  };
  const Route routes[] = {{"GET", "/kv/info", &Impl::handleKvInfo},
                          {"POST", "/kv/push", &Impl::handleKvPush},
                          {"POST", "/kv/claim", &Impl::handleKvClaim},
                          {"POST", "/kv/nixl/meta", &Impl::handleNixlMeta},
                          {"POST", "/kv/nixl/notify", &Impl::handleNixlNotify}};
  for (const Route& r : routes) {
    server->route(
        r.method, r.target,
        [this, h = r.handler](const http::Request& req, http::ResponseWriter& w)
            -> asio::awaitable<void> { co_await (this->*h)(req, w); },
        nullptr, auth);
  }
  server->route("GET", "/health",
                [](const http::Request&, http::ResponseWriter& w) -> asio::awaitable<void> {
                  std::string empty;  // named: GCC 12 mishandles temporaries inside co_await
                  co_await w.send(200, "text/plain", std::move(empty));
                });
}

bool WorkerAgent::Impl::authorized(const http::Request& req) const {
  const std::string& token = options.token;
  if (token.empty()) return true;
  std::string_view auth = req.header("authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (auth.size() != kBearer.size() + token.size() || !auth.starts_with(kBearer)) return false;
  // Constant-time comparison of the token.
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) {
    diff |= static_cast<unsigned char>(auth[kBearer.size() + i] ^ token[i]);
  }
  return diff == 0;
}

http::ClientRequest WorkerAgent::Impl::peerRequest(std::string method, std::string target,
                                                   std::string body,
                                                   std::chrono::milliseconds timeout) const {
  http::ClientRequest req;
  req.method = std::move(method);
  req.target = std::move(target);
  req.body = std::move(body);
  if (!options.token.empty()) req.headers.emplace_back("authorization", "Bearer " + options.token);
  req.read_timeout = timeout;
  return req;
}

asio::awaitable<void> WorkerAgent::Impl::handleKvInfo(const http::Request&,
                                                      http::ResponseWriter& w) {
  protocol::WorkerInfo info;
  info.instance_id = options.instance_id;
  info.transport_address = transport::base64Encode(transport->workerAddress());
  info.transports = transport->transportsInUse();
  info.block_size = geometry.block_size;
  info.block_bytes = geometry.block_bytes;
  std::string body = protocol::serializeWorkerInfo(info);
  co_await w.sendJson(200, std::move(body));
}

asio::awaitable<void> WorkerAgent::Impl::handleKvPush(const http::Request& req,
                                                      http::ResponseWriter& w) {
  auto parsed = protocol::parsePushRequest(req.body, limits);
  if (parsed.ok() && parsed->block_bytes != geometry.block_bytes) {
    parsed =
        absl::InvalidArgumentError(strCat("block_bytes: ", parsed->block_bytes,
                                          " but this worker's blocks have ", geometry.block_bytes));
  }
  if (!parsed.ok()) {
    m.served_failed->inc();
    co_await w.sendStatus(parsed.status());
    co_return;
  }
  Nanos start = steadyNanos();
  auto response = co_await servePush(std::move(*parsed));
  m.serve_seconds->observe(nanosToSeconds(steadyNanos() - start));
  if (!response.ok()) {  // refused before any put was posted
    m.served_failed->inc();
    co_await w.sendStatus(response.status());
    co_return;
  }
  response->elapsed_us = (steadyNanos() - start) / 1000;
  if (!response->error.empty()) {
    m.served_failed->inc();
  } else if (response->pushed_hashes.empty()) {
    m.served_empty->inc();
  } else {
    m.served_ok->inc();
    m.bytes_out->inc(static_cast<double>(response->pushed_bytes));
  }
  std::string body = protocol::serializePushResponse(*response);
  co_await w.sendJson(200, std::move(body));
}

asio::awaitable<void> WorkerAgent::Impl::handleKvClaim(const http::Request& req,
                                                       http::ResponseWriter& w) {
  auto claim = protocol::parseLandingClaim(req.body);
  absl::Status refusal;
  auto it = claim.ok() ? open_landings.find(claim->landing_id) : open_landings.end();
  if (!claim.ok()) {
    refusal = claim.status();
  } else if (it == open_landings.end()) {
    m.claim_unknown->inc();
    refusal = absl::NotFoundError(
        strCat("landing_id: ", claim->landing_id, " is not an outstanding landing here"));
  } else if (it->second.claimed) {
    m.claim_repeated->inc();
    refusal =
        absl::AlreadyExistsError(strCat("landing_id: ", claim->landing_id, " was claimed already"));
  }
  if (!refusal.ok()) {
    co_await w.sendStatus(refusal);
    co_return;
  }
  it->second.claimed = true;
  protocol::LandingGrant grant;
  grant.landing_id = claim->landing_id;
  grant.transport_address = transport::base64Encode(transport->workerAddress());
  grant.rkey = transport::base64Encode(pool_region->packedRkey());
  grant.block_addrs = it->second.block_addrs;
  grant.block_bytes = geometry.block_bytes;
  std::string body = protocol::serializeLandingGrant(grant);
  co_await w.sendJson(200, std::move(body));
}

}  // namespace kvf::worker
