// KV push inside the live engine, setup and holder side: the UCX transport with the KV pool
// payload registered once, the worker control server (GET /kv/info, POST /kv/push with a
// bearer token) and remote-decode lease expiry. A push pins the leading run of wanted blocks on
// the core thread, puts them from the HTTP thread without involving the scheduler, and unpins
// them on the core thread when the put completed. See docs/protocols.md, "KV push".
#include <cstdlib>
#include <cstring>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/engine_server_impl.h"
#include "transport/asio_completion.h"
#include "transport/base64.h"
#include "transport/transport_metrics.h"
#include "worker/block_payload.h"

namespace kvf::engine {

using detail::kAwait;
using detail::steadyNanos;
namespace kt = kvf::transport;

absl::Status EngineServer::Impl::createPush() {
  const WorkerConfig& wc = config.worker;
  if (config.cache.payload_bytes_per_block == 0) {
    return absl::InvalidArgumentError("worker: KV push needs cache.payload_bytes_per_block > 0");
  }
  worker_token = wc.token;
  if (worker_token.empty()) {
    if (const char* env = std::getenv("KVF_WORKER_TOKEN"); env != nullptr) worker_token = env;
  }
  if (worker_token.empty()) {
    log::warn("worker control server has no bearer token (set worker.token or KVF_WORKER_TOKEN)");
  }
  push_limits.max_blocks = static_cast<size_t>(wc.max_push_blocks);
  kt::TransportOptions to;
  to.name = config.instance_id;
  to.transports = wc.transports;
  to.net_devices = wc.net_devices;
  to.max_blocks_per_put = static_cast<uint32_t>(wc.max_push_blocks);
  KVF_ASSIGN_OR_RETURN(transport, kt::TransportContext::create(to));
  std::span<std::byte> region = core->pool().payloadRegion();
  KVF_ASSIGN_OR_RETURN(pool_region, transport->registerMemory(region.data(), region.size()));
  http::ServerOptions so;
  so.host = wc.host;
  so.port = static_cast<uint16_t>(wc.port);
  so.max_body_bytes = 64 * push_limits.max_blocks + (1 << 20);  // two u64 arrays + blobs
  KVF_ASSIGN_OR_RETURN(worker_http, http::HttpServer::create(ioc, so));
  worker_http->route(
      "GET", "/kv/info",
      [this](const http::Request& r, http::ResponseWriter& w) -> asio::awaitable<void> {
        co_await handleKvInfo(r, w);
      });
  worker_http->route(
      "POST", "/kv/push",
      [this](const http::Request& r, http::ResponseWriter& w) -> asio::awaitable<void> {
        co_await handleKvPush(r, w);
      });
  worker_http->route("GET", "/health",
                     [](const http::Request&, http::ResponseWriter& w) -> asio::awaitable<void> {
                       std::string empty;
                       co_await w.send(200, "text/plain", std::move(empty));
                     });
  if (!wc.fault.empty()) log::warn("worker fault injection is ON (test only)", "fault", wc.fault);
  registerPushMetrics();
  return absl::OkStatus();
}

void EngineServer::Impl::registerPushMetrics() {
  metrics::Labels labels = {{"model_name", config.served_model_name}};
  auto with = [&](const char* key, const char* value) {
    metrics::Labels l = labels;
    l.emplace_back(key, value);
    return l;
  };
  const char* fetches = "kvfabric_engine_kv_push_fetches_total";
  const char* fetch_help = "Remote-KV fetches by outcome (ok, partial, fallback)";
  pm.fetch_ok = &registry.counter(fetches, fetch_help, with("outcome", "ok"));
  pm.fetch_partial = &registry.counter(fetches, fetch_help, with("outcome", "partial"));
  pm.fetch_fallback = &registry.counter(fetches, fetch_help, with("outcome", "fallback"));
  pm.tokens_in = &registry.counter("kvfabric_engine_kv_push_received_tokens_total",
                                   "Tokens of KV received from peers and used", labels);
  pm.bytes_in = &registry.counter("kvfabric_engine_kv_push_received_bytes_total",
                                  "Payload bytes received from peers and used", labels);
  pm.fetch_seconds = &registry.histogram(
      "kvfabric_engine_kv_push_fetch_seconds",
      "Wall time from fetch start to complete/fail (includes the modelled link time)",
      metrics::exponentialBuckets(1e-4, 2, 16), labels);
  const char* served = "kvfabric_worker_push_served_total";
  const char* served_help = "POST /kv/push answered by outcome (ok, empty, failed)";
  pm.served_ok = &registry.counter(served, served_help, with("outcome", "ok"));
  pm.served_empty = &registry.counter(served, served_help, with("outcome", "empty"));
  pm.served_failed = &registry.counter(served, served_help, with("outcome", "failed"));
  pm.bytes_out = &registry.counter("kvfabric_worker_push_sent_bytes_total",
                                   "Payload bytes pushed to peers", labels);
  pm.serve_seconds =
      &registry.histogram("kvfabric_worker_push_seconds", "Holder time per push (wall)",
                          metrics::exponentialBuckets(1e-5, 2, 18), labels);
  registry.callback("kvfabric_engine_kv_push_waiting", "Requests waiting for remote KV",
                    metrics::MetricType::kGauge, labels,
                    [this] { return snapshot.waiting_remote.load(); });
  registry.callback("kvfabric_engine_kv_push_leases", "Remote-decode leases holding blocks",
                    metrics::MetricType::kGauge, labels, [this] { return snapshot.leases.load(); });
  registry.callback("kvfabric_engine_kv_push_quarantined_blocks",
                    "Landing blocks held until no late write can reach them",
                    metrics::MetricType::kGauge, labels,
                    [this] { return snapshot.quarantined.load(); });
  kt::exportMetrics(*transport, registry, labels);
}

std::string EngineServer::Impl::workerUrl() const {
  if (!worker_http) return {};
  std::string host = config.worker.host == "0.0.0.0" ? "127.0.0.1" : config.worker.host;
  return strCat("http://", host, ":", worker_http->port());
}

bool EngineServer::Impl::authorized(const http::Request& req) const {
  if (worker_token.empty()) return true;
  std::string_view auth = req.header("authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (auth.size() != kBearer.size() + worker_token.size() || !auth.starts_with(kBearer)) {
    return false;
  }
  // Constant-time comparison of the token.
  unsigned char diff = 0;
  for (size_t i = 0; i < worker_token.size(); ++i) {
    diff |= static_cast<unsigned char>(auth[kBearer.size() + i] ^ worker_token[i]);
  }
  return diff == 0;
}

asio::awaitable<void> EngineServer::Impl::handleKvInfo(const http::Request& req,
                                                       http::ResponseWriter& w) {
  if (!authorized(req)) {
    co_await w.sendError(401, "missing or wrong bearer token");
    co_return;
  }
  protocol::WorkerInfo info;
  info.instance_id = config.instance_id;
  info.transport_address = kt::base64Encode(transport->workerAddress());
  info.transports = transport->transportsInUse();
  info.block_size = config.cache.block_size;
  info.block_bytes = config.cache.payload_bytes_per_block;
  std::string body = protocol::serializeWorkerInfo(info);
  co_await w.sendJson(200, std::move(body));
}

asio::awaitable<void> EngineServer::Impl::handleKvPush(const http::Request& req,
                                                       http::ResponseWriter& w) {
  if (!authorized(req)) {
    co_await w.sendError(401, "missing or wrong bearer token");
    co_return;
  }
  auto parsed = protocol::parsePushRequest(req.body, push_limits);
  if (parsed.ok() && parsed->block_bytes != config.cache.payload_bytes_per_block) {
    parsed = absl::InvalidArgumentError(strCat("block_bytes: ", parsed->block_bytes,
                                               " but this worker's blocks have ",
                                               config.cache.payload_bytes_per_block));
  }
  if (!parsed.ok()) {
    pm.served_failed->inc();
    co_await w.sendStatus(parsed.status());
    co_return;
  }
  Nanos start = steadyNanos();
  auto response = co_await servePush(std::move(*parsed));
  pm.serve_seconds->observe(nanosToSeconds(steadyNanos() - start));
  if (!response.ok()) {  // refused before any put was posted
    pm.served_failed->inc();
    co_await w.sendStatus(response.status());
    co_return;
  }
  response->elapsed_us = (steadyNanos() - start) / 1000;
  if (!response->error.empty()) {
    pm.served_failed->inc();
  } else if (response->pushed_hashes.empty()) {
    pm.served_empty->inc();
  } else {
    pm.served_ok->inc();
    pm.bytes_out->inc(static_cast<double>(response->pushed_bytes));
  }
  std::string body = protocol::serializePushResponse(*response);
  co_await w.sendJson(200, std::move(body));
}

namespace {

// Test-only fault: a scratch copy of the pinned blocks with one damaged byte per block.
absl::StatusOr<std::shared_ptr<kt::MemoryRegion>> corruptCopy(kt::TransportContext& ctx,
                                                              const KvPool& pool,
                                                              std::vector<kt::BlockCopy>& blocks,
                                                              std::vector<uint64_t>* good_sums) {
  uint64_t bytes = 0;
  for (const auto& b : blocks) bytes += b.length;
  KVF_ASSIGN_OR_RETURN(auto scratch, ctx.allocateMemory(bytes));
  auto* dst = static_cast<std::byte*>(scratch->data());
  uint64_t offset = 0;
  const std::byte* base = pool.payload(0).data();
  for (auto& b : blocks) {
    std::memcpy(dst + offset, base + b.local_offset, b.length);
    good_sums->push_back(kt::blockChecksum(dst + offset, b.length));
    dst[offset + b.length / 2] ^= std::byte{0x5a};
    b.local_offset = offset;
    offset += b.length;
  }
  return scratch;
}

}  // namespace

asio::awaitable<absl::StatusOr<protocol::PushResponse>> EngineServer::Impl::servePush(
    protocol::PushRequest req) {
  const Nanos received = steadyNanos();
  KVF_CO_ASSIGN_OR_RETURN(std::string peer,
                          kt::base64Decode(req.receiver_address, push_limits.max_blob_bytes));
  KVF_CO_ASSIGN_OR_RETURN(std::string rkey, kt::base64Decode(req.rkey, push_limits.max_blob_bytes));
  const WorkerConfig& wc = config.worker;
  if (wc.fault == "stall") {
    asio::steady_timer stall(ioc);
    stall.expires_after(std::chrono::milliseconds(wc.fault_stall_ms));
    co_await stall.async_wait(kAwait);
  }
  std::vector<BlockHash> hashes = req.block_hashes;
  auto pin = [this, hashes]() -> asio::awaitable<std::vector<BlockIndex>> {
    co_return core->pinLeadingRun(hashes);
  };
  std::vector<BlockIndex> pinned = co_await asio::co_spawn(core_ioc, pin, asio::use_awaitable);
  protocol::PushResponse out;
  const size_t k = pinned.size();
  out.pushed_hashes.assign(hashes.begin(), hashes.begin() + static_cast<std::ptrdiff_t>(k));
  out.missing_hashes.assign(hashes.begin() + static_cast<std::ptrdiff_t>(k), hashes.end());
  absl::StatusOr<kt::PutResult> result = kt::PutResult{};
  if (k > 0) {
    const uint64_t bytes = config.cache.payload_bytes_per_block;
    kt::PutRequest put;
    put.source = pool_region;
    put.peer_address = std::move(peer);
    put.peer_rkey = std::move(rkey);
    for (size_t i = 0; i < k; ++i)
      put.blocks.push_back({pinned[i] * bytes, req.block_addrs[i], bytes});
    // Even when late, push with a usable deadline: the receiver may have given up, and only
    // the completion notice (or our death) lets it reuse the landing blocks it quarantined.
    Nanos left = req.deadline_ms * 1'000'000 - (steadyNanos() - received);
    put.deadline = std::chrono::milliseconds(std::max<Nanos>(200, left / 1'000'000));
    put.checksums = kt::ChecksumMode::kCompute;
    put.landing_id = req.landing_id;
    if (wc.fault == "corrupt" || wc.fault == "corrupt_content") {
      std::vector<uint64_t> good;
      auto scratch = corruptCopy(*transport, core->pool(), put.blocks, &good);
      if (scratch.ok()) {
        put.source = *scratch;
        if (wc.fault == "corrupt") {
          put.checksums = kt::ChecksumMode::kProvided;
          put.provided_checksums = std::move(good);
        }
      } else {
        result = scratch.status();
      }
    }
    if (result.ok()) {
      out.put_issued = true;
      result = co_await kt::asyncPut(*transport, put, asio::use_awaitable);
    }
    if (put.source != pool_region) put.source->release([] {});
  }
  auto unpin = [this, pushed = out.pushed_hashes, lease = req.lease_id]() -> asio::awaitable<void> {
    core->unpin(pushed);
    if (!lease.empty()) core->releaseLease(lease);  // the lease served its purpose
    publishStats();
    co_return;
  };
  co_await asio::co_spawn(core_ioc, unpin, asio::use_awaitable);
  if (!result.ok()) {
    out.error = std::string(result.status().message());
    log::warn("kv push failed", "request", req.request_id, "blocks", k, "error", out.error);
  } else if (k > 0) {
    out.pushed_bytes = result->bytes;
    out.checksums = result->checksums;
  }
  co_return out;
}

asio::awaitable<void> EngineServer::Impl::leaseLoop() {
  while (!stopping) {
    lease_timer.expires_after(std::chrono::milliseconds(50));
    co_await lease_timer.async_wait(kAwait);
    if (stopping) break;
    if (core->expireLeases(engineNow(steadyNanos())) > 0) publishStats();
  }
}

}  // namespace kvf::engine
