// WorkerAgent in vLLM's NixlConnector dialect (docs/protocols.md, "NixlConnector dialect").
// Holder (P, or a cache holder C): the side channel answers POST /kv/nixl/meta with what a reader
// needs to READ the blocks its lease holds (rkey, region, per-block hash and checksum; each call
// is a heartbeat that extends the lease as vLLM's does) and POST /kv/nixl/notify, after which the
// lease ends and the blocks are unpinned. Reader (D): asks for the metadata, reads the leading run
// of its landing's blocks with one-sided gets checked against the holder's checksums and the
// engine's own block hashes, then notifies the holder, whatever happened.
#include <algorithm>
#include <unordered_set>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "transport/asio_completion.h"
#include "transport/base64.h"
#include "transport/remote_key.h"
#include "worker/agent_internal.h"

namespace kvf::worker {

using agent_internal::kAwait;
using agent_internal::kMs;
using agent_internal::msUntil;
using agent_internal::Steady;
using agent_internal::steadyNanos;
using agent_internal::toTimePoint;
using agent_internal::TransferResult;
namespace kt = kvf::transport;

// Both routes run behind the worker's bearer-token check on the request head (registerRoutes).
asio::awaitable<void> WorkerAgent::Impl::handleNixlMeta(const http::Request& req,
                                                        http::ResponseWriter& w) {
  auto parsed = protocol::parseNixlMetaRequest(req.body, limits);
  if (!parsed.ok()) {
    co_await w.sendStatus(parsed.status());
    co_return;
  }
  // On the engine thread: the lease (extended: this is D's heartbeat), the indices of its blocks,
  // and the payload checksums, read while the lease's pins keep the blocks from reuse.
  auto describe = [this, r = std::move(*parsed)]() -> absl::StatusOr<protocol::NixlMetaResponse> {
    const Nanos now = adapter.now();
    const Lease* lease = leases.heartbeat(r.remote_request_id, now);
    if (lease == nullptr) {
      return absl::NotFoundError(
          strCat("no lease holds the blocks of request ", r.remote_request_id));
    }
    std::vector<BlockIndex> held = adapter.pinLeadingRun(lease->hashes);
    protocol::NixlMetaResponse out;
    out.lease_remaining_ms = (lease->expires_at - now) / kMs;
    const auto* pool = static_cast<const std::byte*>(pool_region->data());
    for (uint64_t id : r.block_ids) {
      auto it = std::find(held.begin(), held.end(), static_cast<BlockIndex>(id));
      if (it == held.end()) break;  // the leading run of what the lease holds
      out.block_ids.push_back(id);
      out.block_hashes.push_back(lease->hashes[static_cast<size_t>(it - held.begin())]);
      out.checksums.push_back(
          kt::blockChecksum(pool + id * geometry.block_bytes, geometry.block_bytes));
    }
    if (!held.empty()) {
      adapter.unpin(std::span<const BlockHash>(lease->hashes.data(), held.size()));
    }
    return out;
  };
  absl::StatusOr<protocol::NixlMetaResponse> meta = co_await onEngineThread(std::move(describe));
  if (!meta.ok()) {
    m.nixl_meta_refused->inc();
    co_await w.sendStatus(meta.status());
    co_return;
  }
  m.nixl_meta_served->inc();
  meta->engine_id = options.engine_id;
  meta->rkey = kt::base64Encode(pool_region->packedRkey());  // carries the pool's bounds
  std::string body = protocol::serializeNixlMetaResponse(*meta);
  co_await w.sendJson(200, std::move(body));
}

asio::awaitable<void> WorkerAgent::Impl::handleNixlNotify(const http::Request& req,
                                                          http::ResponseWriter& w) {
  auto parsed = protocol::parseNixlNotify(req.body, limits);
  if (!parsed.ok()) {
    co_await w.sendStatus(parsed.status());
    co_return;
  }
  // Only a live lease ends here: an expired one is the expiry timer's to free, and a notify that
  // names none is refused, so that a peer cannot probe or replay lease ids unnoticed.
  auto release = [this, id = parsed->remote_request_id] {
    const Lease* lease = leases.heartbeat(id, adapter.now());
    if (lease == nullptr) return false;
    releaseLease(id);
    return true;
  };
  const bool released = co_await onEngineThread(std::move(release));
  if (!released) {
    m.nixl_notify_refused->inc();
    co_await w.sendError(404, strCat("no live lease ", parsed->remote_request_id));
    co_return;
  }
  m.nixl_notified->inc();
  std::string body = "{\"released\":true}";
  co_await w.sendJson(200, std::move(body));
}

namespace {

// The leading run of `f.hashes` that the holder's answer covers: entry i is the holder's block
// whose engine hash is f.hashes[i] (the holder's prompt and ours hash alike).
std::vector<size_t> matchLeadingRun(const RemoteKvFetch& f, const protocol::NixlMetaResponse& m) {
  std::vector<size_t> run;
  for (BlockHash h : f.hashes) {
    auto it = std::find(m.block_hashes.begin(), m.block_hashes.end(), h);
    if (it == m.block_hashes.end()) break;
    run.push_back(static_cast<size_t>(it - m.block_hashes.begin()));
  }
  return run;
}

// The holder's answer, refused when it names a block the signed params did not: the holder may
// only narrow what the router named, never widen it.
absl::StatusOr<protocol::NixlMetaResponse> withinNamedBlocks(protocol::NixlMetaResponse meta,
                                                             const std::vector<uint64_t>& named) {
  if (meta.block_ids.size() > named.size()) {
    return absl::FailedPreconditionError(strCat("holder answered ", meta.block_ids.size(),
                                                " blocks, the params name ", named.size()));
  }
  const std::unordered_set<uint64_t> allowed(named.begin(), named.end());
  for (uint64_t id : meta.block_ids) {
    if (!allowed.contains(id)) {
      return absl::FailedPreconditionError(
          strCat("holder answered block ", id, ", which the params do not name"));
    }
  }
  return meta;
}

}  // namespace

asio::awaitable<TransferResult> WorkerAgent::Impl::readNixlBlocks(const RemoteKvFetch& f,
                                                                  Nanos deadline) {
  TransferResult out;
  const NixlRead& nixl = *f.nixl;
  const uint64_t bytes = geometry.block_bytes;
  auto sw = co_await sourceWorker(f.source, deadline);
  if (!sw.ok()) {
    out.reason = strCat("side channel: ", std::string(sw.status().message()));
    sources.erase(f.source);
    co_return out;
  }
  const protocol::WorkerInfo& info = *(*sw)->info;
  if (info.block_bytes != bytes || info.block_size != geometry.block_size) {
    out.reason = strCat("holder blocks are ", info.block_size, " tokens / ", info.block_bytes,
                        " bytes, ours ", geometry.block_size, " / ", bytes);
    co_return out;
  }
  protocol::NixlMetaRequest mr{nixl.remote_request_id, nixl.remote_block_ids};
  http::ClientRequest req = peerRequest("POST", "/kv/nixl/meta",
                                        protocol::serializeNixlMetaRequest(mr), msUntil(deadline));
  auto resp = co_await (*sw)->client->request(std::move(req));
  absl::StatusOr<protocol::NixlMetaResponse> meta = absl::UnavailableError("no answer");
  if (!resp.ok()) {
    meta = resp.status();
    sources.erase(f.source);
  } else if (resp->status != 200) {
    meta = absl::UnavailableError(strCat("HTTP ", resp->status, " ", resp->body.substr(0, 200)));
  } else {
    meta = protocol::parseNixlMetaResponse(resp->body, limits);
  }
  if (meta.ok() && !nixl.remote_engine_id.empty() && meta->engine_id != nixl.remote_engine_id) {
    meta = absl::FailedPreconditionError(strCat(
        "holder is engine '", meta->engine_id, "', the params name '", nixl.remote_engine_id, "'"));
  }
  if (meta.ok()) meta = withinNamedBlocks(std::move(*meta), nixl.remote_block_ids);
  if (!meta.ok()) {
    out.reason = strCat("POST /kv/nixl/meta: ", std::string(meta.status().message()));
    co_return out;  // nothing was read; the holder's lease ends by expiry (or never existed)
  }
  std::vector<size_t> run = matchLeadingRun(f, *meta);
  absl::StatusOr<kt::PutResult> got = absl::NotFoundError("the holder's lease holds none of them");
  if (!run.empty()) {
    kt::GetRequest get;
    get.destination = pool_region;
    get.peer_address = (*sw)->transport_address;
    auto rkey = kt::base64Decode(meta->rkey, limits.max_blob_bytes);
    get.peer_rkey = rkey.ok() ? *rkey : std::string();
    // The holder's pool bounds travel inside its key. A key that does not parse leaves them 0:
    // postGet refuses it (and counts the refusal) before UCX sees it.
    auto key = kt::parseRemoteKey(get.peer_rkey);
    const uint64_t pool_base = key.ok() ? key->base : 0;
    const uint64_t pool_length = key.ok() ? key->length : 0;
    for (size_t i = 0; i < run.size(); ++i) {
      const uint64_t id = meta->block_ids[run[i]];
      // Written so that a hostile id cannot overflow; postGet checks the range again.
      const uint64_t addr = id < pool_length / bytes ? pool_base + id * bytes : 0;
      get.blocks.push_back({f.blocks[i] * bytes, addr, bytes});
      get.expected_checksums.push_back(meta->checksums[run[i]]);
    }
    get.deadline = msUntil(deadline);
    got = co_await asyncRead(get, &out.get);
  }
  if (got.ok()) {
    out.landed = run.size();
    out.bytes = got->bytes;
    if (out.landed < f.hashes.size()) {
      out.reason = strCat("holder held ", out.landed, " of ", f.hashes.size(), " blocks");
    }
  } else {
    out.reason = strCat("read: ", std::string(got.status().message()));
  }
  out.writes_may_arrive = out.get != nullptr && !out.get->drained();
  // vLLM's read-completion notification: the holder frees the blocks now, not at lease expiry.
  http::ClientRequest notify =
      peerRequest("POST", "/kv/nixl/notify",
                  protocol::serializeNixlNotify({nixl.remote_request_id}), std::chrono::seconds(1));
  auto ack = co_await (*sw)->client->request(std::move(notify));
  if (!ack.ok() || ack->status != 200) {
    log::warn("nixl notify failed; the holder frees the blocks at lease expiry", "request",
              nixl.remote_request_id);
  }
  co_return out;
}

asio::awaitable<absl::StatusOr<kt::PutResult>> WorkerAgent::Impl::asyncRead(
    const kt::GetRequest& get, std::shared_ptr<kt::PutHandle>* handle) {
  auto signal = std::make_shared<asio::steady_timer>(ioc, Steady::time_point::max());
  auto result = std::make_shared<std::optional<absl::StatusOr<kt::PutResult>>>();
  auto on_done = [signal, result](absl::StatusOr<kt::PutResult> r) {
    *result = std::move(r);
    signal->cancel();
  };
  auto posted = transport->postGet(get, kt::onExecutor(ioc.get_executor(), on_done));
  if (!posted.ok()) co_return posted.status();
  *handle = *posted;
  while (!result->has_value()) co_await signal->async_wait(kAwait);  // the get's deadline bounds it
  co_return std::move(**result);
}

}  // namespace kvf::worker
