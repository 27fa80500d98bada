// WorkerAgent, holder side of KV push: pins the leading run of the wanted blocks on the engine
// thread, puts them from the agent thread into the receiver's landing memory (checksums
// computed, completion notice naming the landing) without involving the engine's scheduler,
// then unpins them (and releases the lease the request names) on the engine thread.
#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "transport/asio_completion.h"
#include "transport/base64.h"
#include "worker/agent_internal.h"

namespace kvf::worker {

using agent_internal::kAwait;
using agent_internal::kMs;
using agent_internal::steadyNanos;
namespace kt = kvf::transport;

namespace {

// TEST ONLY fault: a scratch copy of the pinned blocks with one damaged byte per block.
absl::StatusOr<std::shared_ptr<kt::MemoryRegion>> corruptCopy(kt::TransportContext& ctx,
                                                              const std::byte* pool,
                                                              std::vector<kt::BlockCopy>& blocks,
                                                              std::vector<uint64_t>* good_sums) {
  uint64_t bytes = 0;
  for (const auto& b : blocks) bytes += b.length;
  KVF_ASSIGN_OR_RETURN(auto scratch, ctx.allocateMemory(bytes));
  auto* dst = static_cast<std::byte*>(scratch->data());
  uint64_t offset = 0;
  for (auto& b : blocks) {
    std::memcpy(dst + offset, pool + b.local_offset, b.length);
    good_sums->push_back(kt::blockChecksum(dst + offset, b.length));
    dst[offset + b.length / 2] ^= std::byte{0x5a};
    b.local_offset = offset;
    offset += b.length;
  }
  return scratch;
}

}  // namespace

asio::awaitable<absl::StatusOr<protocol::PushResponse>> WorkerAgent::Impl::servePush(
    protocol::PushRequest req) {
  const Nanos received = steadyNanos();
  if (!options.peers.empty() && std::find(options.peers.begin(), options.peers.end(),
                                          req.receiver_url) == options.peers.end()) {
    m.refused_not_a_peer->inc();
    co_return absl::PermissionDeniedError(
        strCat("receiver_url: ", req.receiver_url, " is not one of this worker's peers"));
  }
  // Named: GCC 12 mishandles temporaries inside co_await.
  auto pin = [this, hashes = req.block_hashes] { return adapter.pinLeadingRun(hashes); };
  std::vector<BlockIndex> pinned = co_await onEngineThread(std::move(pin));
  protocol::PushResponse out;
  const size_t k = std::min(pinned.size(), req.block_hashes.size());
  const auto split = req.block_hashes.begin() + static_cast<std::ptrdiff_t>(k);
  out.pushed_hashes.assign(req.block_hashes.begin(), split);
  out.missing_hashes.assign(split, req.block_hashes.end());
  absl::StatusOr<kt::PutResult> result = kt::PutResult{};
  absl::StatusOr<protocol::LandingGrant> grant = protocol::LandingGrant{};
  // Nothing is written without the receiver's grant, and only with its address and key.
  if (k > 0) grant = co_await claimLanding(req);
  absl::StatusOr<std::string> peer = std::string(), rkey = std::string();
  if (k > 0 && grant.ok()) {
    peer = kt::base64Decode(grant->transport_address, limits.max_blob_bytes);
    rkey = kt::base64Decode(grant->rkey, limits.max_blob_bytes);
    if (!peer.ok() || !rkey.ok()) {
      m.refused_not_granted->inc();
      grant = absl::FailedPreconditionError("the receiver's grant carries undecodable keys");
    }
  }
  if (!grant.ok()) {
    auto unpin = [this, pushed = out.pushed_hashes] {
      if (!pushed.empty()) adapter.unpin(pushed);
      return true;
    };
    co_await onEngineThread(std::move(unpin));
    log::warn("kv push refused before any write", "request", req.request_id, "error",
              std::string(grant.status().message()));
    co_return grant.status();
  }
  if (k > 0 && options.fault == "stall") {  // a holder slow to write what it was granted
    asio::steady_timer stall(ioc);
    stall.expires_after(std::chrono::milliseconds(options.fault_stall_ms));
    co_await stall.async_wait(kAwait);
  }
  if (k > 0) {
    const uint64_t bytes = geometry.block_bytes;
    kt::PutRequest put;
    put.source = pool_region;
    put.peer_address = std::move(*peer);
    put.peer_rkey = std::move(*rkey);
    for (size_t i = 0; i < k; ++i) {
      put.blocks.push_back({pinned[i] * bytes, req.block_addrs[i], bytes});
    }
    // Even when late, push with a usable deadline: the receiver may have given up, and only
    // the completion notice (or our death) lets it reuse the landing blocks it quarantined.
    Nanos left = req.deadline_ms * kMs - (steadyNanos() - received);
    put.deadline = std::chrono::milliseconds(std::max<Nanos>(200, left / kMs));
    put.checksums = kt::ChecksumMode::kCompute;
    put.landing_id = req.landing_id;
    if (options.fault == "corrupt" || options.fault == "corrupt_content") {
      std::vector<uint64_t> good;
      auto* pool = static_cast<const std::byte*>(pool_region->data());
      auto scratch = corruptCopy(*transport, pool, put.blocks, &good);
      if (scratch.ok()) {
        put.source = *scratch;
        if (options.fault == "corrupt") {
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
  auto unpin = [this, pushed = out.pushed_hashes, lease = req.lease_id] {
    if (!pushed.empty()) adapter.unpin(pushed);
    if (!lease.empty()) releaseLease(lease);  // the lease served its purpose
    return true;
  };
  co_await onEngineThread(std::move(unpin));
  if (!result.ok()) {
    out.error = std::string(result.status().message());
    log::warn("kv push failed", "request", req.request_id, "blocks", k, "error", out.error);
  } else if (k > 0) {
    out.pushed_bytes = result->bytes;
    out.checksums = result->checksums;
  }
  co_return out;
}

asio::awaitable<absl::StatusOr<protocol::LandingGrant>> WorkerAgent::Impl::claimLanding(
    const protocol::PushRequest& req) {
  auto refuse = [&](metrics::Counter* counter, std::string why) {
    counter->inc();
    return absl::FailedPreconditionError(
        strCat("landing ", req.landing_id, " at ", req.receiver_url, ": ", why));
  };
  auto sw = workerAt(req.receiver_url);
  if (!sw.ok()) co_return refuse(m.refused_not_granted, std::string(sw.status().message()));
  http::ClientRequest claim =
      peerRequest("POST", "/kv/claim", protocol::serializeLandingClaim({req.landing_id}),
                  std::chrono::milliseconds(std::max<int64_t>(1, req.deadline_ms)));
  auto resp = co_await (*sw)->client->request(std::move(claim));
  if (!resp.ok()) {
    sources.erase(req.receiver_url);
    co_return refuse(m.refused_not_granted,
                     strCat("claim failed: ", std::string(resp.status().message())));
  }
  if (resp->status != 200) {
    co_return refuse(m.refused_not_granted, strCat("the receiver refused the claim: HTTP ",
                                                   resp->status, " ", resp->body.substr(0, 200)));
  }
  auto grant = protocol::parseLandingGrant(resp->body, limits);
  if (!grant.ok()) {
    co_return refuse(m.refused_not_granted,
                     strCat("grant: ", std::string(grant.status().message())));
  }
  // The request must describe the landing the receiver granted, block for block; a push may
  // cover a leading part of it only as the holder's own shortfall, never by asking.
  if (grant->landing_id != req.landing_id || grant->block_bytes != req.block_bytes ||
      grant->block_addrs != req.block_addrs || grant->rkey != req.rkey ||
      grant->transport_address != req.receiver_address) {
    co_return refuse(m.refused_mismatch,
                     "the request differs from the landing the receiver granted");
  }
  co_return std::move(*grant);
}

}  // namespace kvf::worker
