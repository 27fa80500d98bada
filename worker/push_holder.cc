// WorkerAgent, holder side of KV push: pins the leading run of the wanted blocks on the engine
// thread (the pool's run, then what its lower tiers hold after it: host blocks in their slots,
// disk blocks read into bounce blocks and checked), puts them from the agent thread into the
// receiver's landing memory (one put per source region, checksums computed, one completion
// notice naming the landing) without involving the engine's scheduler, then unpins them (and
// releases the lease the request names) on the engine thread.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

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

// TEST ONLY fault: a scratch copy of the blocks to send with one damaged byte per block.
absl::StatusOr<std::shared_ptr<kt::MemoryRegion>> corruptCopy(kt::TransportContext& ctx,
                                                              const std::byte* source,
                                                              std::vector<kt::BlockCopy>& blocks,
                                                              std::vector<uint64_t>* good_sums) {
  uint64_t bytes = 0;
  for (const auto& b : blocks) bytes += b.length;
  KVF_ASSIGN_OR_RETURN(auto scratch, ctx.allocateMemory(bytes));
  auto* dst = static_cast<std::byte*>(scratch->data());
  uint64_t offset = 0;
  for (auto& b : blocks) {
    std::memcpy(dst + offset, source + b.local_offset, b.length);
    good_sums->push_back(kt::blockChecksum(dst + offset, b.length));
    dst[offset + b.length / 2] ^= std::byte{0x5a};
    b.local_offset = offset;
    offset += b.length;
  }
  return scratch;
}

// One push's share of the agent's count of disk reads that may still write into its bounce
// region, which the agent's destruction waits to see at zero. Released once the reads are
// reported, or when whoever holds it is destroyed without reporting: the engine's pin task
// dropped unrun (an engine thread stopped before the agent), or the store's callback dropped
// uncalled. Held by one thread at a time.
class TierReadsClaim {
 public:
  explicit TierReadsClaim(std::shared_ptr<std::atomic<int64_t>> count) : count_(std::move(count)) {
    if (count_ != nullptr) count_->fetch_add(1);
  }
  TierReadsClaim(TierReadsClaim&&) noexcept = default;
  TierReadsClaim& operator=(TierReadsClaim&&) = delete;
  ~TierReadsClaim() { release(); }
  void release() {
    if (count_ != nullptr) std::exchange(count_, nullptr)->fetch_sub(1);
  }

 private:
  std::shared_ptr<std::atomic<int64_t>> count_;
};

}  // namespace

asio::awaitable<agent_internal::HolderPins> WorkerAgent::Impl::pinForPush(
    const protocol::PushRequest& req, Nanos deadline,
    std::shared_ptr<agent_internal::TierReads> reads) {
  // Bounce blocks for the disk part, taken before the engine looks (the engine thread never
  // touches the pool of them); what finds none is answered missing.
  std::vector<std::span<std::byte>> buffers;
  if (bounce_region != nullptr) {
    std::lock_guard lock(bounce->mu);
    const size_t want = req.block_hashes.size();
    while (reads->slots.size() < want && !bounce->free.empty()) {
      reads->slots.push_back(bounce->free.back());
      bounce->free.pop_back();
    }
  }
  auto* base = bounce_region != nullptr ? static_cast<std::byte*>(bounce_region->data()) : nullptr;
  for (uint32_t slot : reads->slots) {
    buffers.emplace_back(base + uint64_t{slot} * bounce_stride, geometry.block_bytes);
  }
  const bool tiers = tier_region != nullptr;
  TierReadsClaim claim(tiers ? tier_reads_in_flight : nullptr);
  // Named: GCC 12 mishandles temporaries inside co_await.
  auto pin = [this, tiers, hashes = req.block_hashes, buffers = std::move(buffers), reads,
              claim = std::move(claim)]() mutable {
    agent_internal::HolderPins p;
    p.pool = adapter.pinLeadingRun(hashes);
    if (!tiers) return p;
    // Runs on the store's thread, possibly after the agent is gone (its destruction stops
    // waiting after a while): it reaches the io_context, never the agent.
    auto on_read = [io = &ioc, reads, claim = std::move(claim)](size_t intact) mutable {
      asio::post(*io, [reads = std::move(reads), intact] {
        reads->done = true;
        reads->intact = intact;
        if (reads->waiter != nullptr) reads->waiter->cancel();
      });
      claim.release();  // last: the agent may go once nothing reads into its memory
    };
    const size_t k = std::min(p.pool.size(), hashes.size());
    if (k < hashes.size()) {
      std::span<const BlockHash> rest(hashes.data() + k, hashes.size() - k);
      p.tier = adapter.pinTierRun(rest, buffers, std::move(on_read));
    } else {
      std::move(on_read)(0);
    }
    return p;
  };
  agent_internal::HolderPins pins = co_await onEngineThread(std::move(pin));
  if (reads->slots.size() > pins.tier.disk) {  // the store got only the first `disk` of them
    std::lock_guard lock(bounce->mu);
    bounce->free.insert(bounce->free.end(), reads->slots.begin() + pins.tier.disk,
                        reads->slots.end());
    reads->slots.resize(pins.tier.disk);
  }
  if (pins.tier.disk > 0 && !reads->done) {
    asio::steady_timer wait(ioc);
    wait.expires_at(toTimePoint(deadline));
    reads->waiter = &wait;
    co_await wait.async_wait(kAwait);
    reads->waiter = nullptr;
  }
  // A disk block not read intact (missing, corrupt, late) ends the run there.
  const size_t intact = reads->done ? reads->intact : 0;
  for (const TierPushBlock& b : pins.tier.blocks) {
    if (b.tier == TierId::kDisk && b.offset >= intact) break;
    ++pins.tier_served;
  }
  if (pins.tier.out_of_buffers) m.bounce_full->inc();
  co_return pins;
}

std::vector<agent_internal::PushSegment> WorkerAgent::Impl::planPush(
    const protocol::PushRequest& req, const agent_internal::HolderPins& pins,
    const agent_internal::TierReads& reads) const {
  std::vector<agent_internal::PushSegment> segments;
  const uint64_t bytes = geometry.block_bytes;
  auto add = [&](const std::shared_ptr<kt::MemoryRegion>& source, uint64_t offset, size_t i) {
    if (segments.empty() || segments.back().source != source) segments.push_back({source, {}});
    segments.back().blocks.push_back({offset, req.block_addrs[i], bytes});
  };
  const size_t k = std::min(pins.pool.size(), req.block_hashes.size());
  for (size_t i = 0; i < k; ++i) add(pool_region, pins.pool[i] * bytes, i);
  for (size_t j = 0; j < pins.tier_served; ++j) {
    const TierPushBlock& b = pins.tier.blocks[j];
    if (b.tier == TierId::kHost) {
      add(tier_region, b.offset, k + j);
    } else {
      add(bounce_region, uint64_t{reads.slots[b.offset]} * bounce_stride, k + j);
    }
  }
  return segments;
}

asio::awaitable<absl::StatusOr<kt::PutResult>> WorkerAgent::Impl::putSegments(
    const protocol::PushRequest& req, std::vector<agent_internal::PushSegment> segments,
    std::string peer, std::string rkey, Nanos received) {
  kt::PutResult total;
  std::vector<kt::NoticeBlock> notice;
  for (size_t s = 0; s < segments.size(); ++s) {
    kt::PutRequest put;
    put.source = segments[s].source;
    put.peer_address = peer;
    put.peer_rkey = rkey;
    put.blocks = std::move(segments[s].blocks);
    // Even when late, push with a usable deadline: the receiver may have given up, and only
    // the completion notice (or our death) lets it reuse the landing blocks it quarantined.
    Nanos left = req.deadline_ms * kMs - (steadyNanos() - received);
    put.deadline = std::chrono::milliseconds(std::max<Nanos>(200, left / kMs));
    put.checksums = kt::ChecksumMode::kCompute;
    // One landing, one notice: the last put names the landing and lists the blocks the earlier
    // ones wrote (they completed before it was posted) with their checksums.
    if (s + 1 == segments.size()) {
      put.landing_id = req.landing_id;
      put.notice_prefix = notice;
    }
    std::shared_ptr<kt::MemoryRegion> scratch;
    if (options.fault == "corrupt" || options.fault == "corrupt_content") {
      std::vector<uint64_t> good;
      auto copy = corruptCopy(*transport, static_cast<const std::byte*>(put.source->data()),
                              put.blocks, &good);
      if (!copy.ok()) co_return copy.status();
      scratch = put.source = *copy;
      if (options.fault == "corrupt") {
        put.checksums = kt::ChecksumMode::kProvided;
        put.provided_checksums = std::move(good);
      }
    }
    absl::StatusOr<kt::PutResult> r = co_await kt::asyncPut(*transport, put, asio::use_awaitable);
    if (scratch != nullptr) scratch->release([] {});
    if (!r.ok()) co_return r.status();
    for (size_t i = 0; i < put.blocks.size(); ++i) {
      const uint64_t sum = i < r->checksums.size() ? r->checksums[i] : 0;
      notice.push_back({put.blocks[i].remote_addr, put.blocks[i].length, sum});
    }
    total.bytes += r->bytes;
    total.blocks += r->blocks;
    total.operations += r->operations;
    total.checksums.insert(total.checksums.end(), r->checksums.begin(), r->checksums.end());
    total.elapsed += r->elapsed;
    total.new_endpoint = total.new_endpoint || r->new_endpoint;
  }
  co_return total;
}

asio::awaitable<absl::StatusOr<protocol::PushResponse>> WorkerAgent::Impl::servePush(
    protocol::PushRequest req) {
  const Nanos received = steadyNanos();
  if (!options.peers.empty() && std::find(options.peers.begin(), options.peers.end(),
                                          req.receiver_url) == options.peers.end()) {
    m.refused_not_a_peer->inc();
    co_return absl::PermissionDeniedError(
        strCat("receiver_url: ", req.receiver_url, " is not one of this worker's peers"));
  }
  auto reads = std::make_shared<agent_internal::TierReads>(bounce);
  const Nanos deadline = received + std::max<int64_t>(1, req.deadline_ms) * kMs;
  agent_internal::HolderPins pins = co_await pinForPush(req, deadline, reads);
  // Makes the engine-thread function that releases the pins (named where awaited: GCC 12
  // mishandles temporaries inside co_await).
  auto unpin_all = [this, &pins, &req](bool release_lease) {
    std::vector<BlockHash> pooled(
        req.block_hashes.begin(),
        req.block_hashes.begin() +
            static_cast<std::ptrdiff_t>(std::min(pins.pool.size(), req.block_hashes.size())));
    return [this, pooled = std::move(pooled), tier = pins.tier.id,
            lease = release_lease ? req.lease_id : std::string()] {
      if (!pooled.empty()) adapter.unpin(pooled);
      adapter.unpinTierRun(tier);
      if (!lease.empty()) releaseLease(lease);  // the lease served its purpose
      return true;
    };
  };
  protocol::PushResponse out;
  const size_t k = std::min(pins.pool.size(), req.block_hashes.size());
  const size_t served = k + pins.tier_served;
  const auto split = req.block_hashes.begin() + static_cast<std::ptrdiff_t>(served);
  out.pushed_hashes.assign(req.block_hashes.begin(), split);
  out.missing_hashes.assign(split, req.block_hashes.end());
  absl::StatusOr<kt::PutResult> result = kt::PutResult{};
  absl::StatusOr<protocol::LandingGrant> grant = protocol::LandingGrant{};
  // Nothing is written without the receiver's grant, and only with its address and key.
  if (served > 0) grant = co_await claimLanding(req);
  absl::StatusOr<std::string> peer = std::string(), rkey = std::string();
  if (served > 0 && grant.ok()) {
    peer = kt::base64Decode(grant->transport_address, limits.max_blob_bytes);
    rkey = kt::base64Decode(grant->rkey, limits.max_blob_bytes);
    if (!peer.ok() || !rkey.ok()) {
      m.refused_not_granted->inc();
      grant = absl::FailedPreconditionError("the receiver's grant carries undecodable keys");
    }
  }
  if (!grant.ok()) {
    auto unpin = unpin_all(false);
    co_await onEngineThread(std::move(unpin));
    log::warn("kv push refused before any write", "request", req.request_id, "error",
              std::string(grant.status().message()));
    co_return grant.status();
  }
  if (served > 0 && options.fault == "stall") {  // a holder slow to write what it was granted
    asio::steady_timer stall(ioc);
    stall.expires_after(std::chrono::milliseconds(options.fault_stall_ms));
    co_await stall.async_wait(kAwait);
  }
  std::vector<agent_internal::PushSegment> segments = planPush(req, pins, *reads);
  if (served > 0) {
    out.put_issued = true;
    result = co_await putSegments(req, segments, std::move(*peer), std::move(*rkey), received);
  }
  auto unpin = unpin_all(true);
  co_await onEngineThread(std::move(unpin));
  if (!result.ok()) {
    out.error = std::string(result.status().message());
    log::warn("kv push failed", "request", req.request_id, "blocks", served, "error", out.error);
  } else if (served > 0) {
    out.pushed_bytes = result->bytes;
    out.checksums = result->checksums;
    for (const agent_internal::PushSegment& s : segments) {
      metrics::Counter* c = s.source == pool_region   ? m.pushed_gpu
                            : s.source == tier_region ? m.pushed_cpu
                                                      : m.pushed_disk;
      c->inc(static_cast<double>(s.blocks.size()));
    }
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
