// Receiver side: landings (expected batches), completion notices, checksum verification.
#include <sys/random.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "common/log.h"
#include "common/status.h"
#include "transport/core.h"
#include "transport/ucx_status.h"

namespace kvf::transport {

namespace {

// From the kernel's CSPRNG, not a seeded generator: a landing id is what lets a completion
// notice resolve a landing, so a peer must not predict the next one from ids it has seen.
uint64_t randomId() {
  uint64_t id = 0;
  while (id == 0) {
    if (::getrandom(&id, sizeof(id), 0) != static_cast<ssize_t>(sizeof(id))) id = 0;
  }
  return id;
}

}  // namespace

void LandingImpl::cancel() {
  auto core = core_;
  core->post([core, self = shared_from_this()] { core->cancelLanding(self.get()); });
}

void LandingImpl::dismiss() {
  auto core = core_;
  core->post([core, self = shared_from_this()] { core->dismissLanding(self.get()); });
}

absl::StatusOr<std::shared_ptr<Landing>> Core::expectPut(
    const std::shared_ptr<MemoryRegion>& region, LandingSpec spec, LandingCallback done) {
  auto target = std::dynamic_pointer_cast<RegionImpl>(region);
  if (!target || target->core_.get() != this) {
    return absl::InvalidArgumentError("region: not a region registered with this context");
  }
  if (spec.blocks.empty()) return absl::InvalidArgumentError("blocks: empty");
  if (spec.blocks.size() > options_.max_blocks_per_put) {
    return absl::InvalidArgumentError(
        strCat("blocks: ", spec.blocks.size(), " exceeds max_blocks_per_put"));
  }
  for (size_t i = 0; i < spec.blocks.size(); ++i) {
    if (spec.blocks[i].length == 0 ||
        !target->contains(spec.blocks[i].remote_addr, spec.blocks[i].length)) {
      return absl::OutOfRangeError(strCat("blocks[", i, "]: [", spec.blocks[i].remote_addr, ", +",
                                          spec.blocks[i].length,
                                          ") is empty or outside the landing region"));
    }
  }
  KVF_RETURN_IF_ERROR(decodePeerAddress(spec.sender_address).status());
  auto landing = std::make_shared<LandingImpl>(shared_from_this(), randomId());
  auto deadline = spec.deadline.count() > 0 ? spec.deadline : options_.default_deadline;
  landing->deadline_at = clock_.now() + std::chrono::nanoseconds(deadline).count();
  landing->region = std::move(target);
  landing->spec = std::move(spec);
  landing->callback = std::move(done);
  return call<absl::StatusOr<std::shared_ptr<Landing>>>(
      [&]() -> absl::StatusOr<std::shared_ptr<Landing>> {
        if (landing->region->releasing()) {
          return absl::FailedPreconditionError("region is being released");
        }
        bool created = false;
        // An endpoint to the sender watches it (peer error mode and/or pidfd).
        KVF_ASSIGN_OR_RETURN(Peer * peer, getPeer(landing->spec.sender_address, &created));
        landing->peer_key = peer->key;
        peer->landings.emplace(landing.get(), landing);
        landings_.emplace(landing->id_, landing);
        landing->region->addUser();
        return std::shared_ptr<Landing>(landing);
      });
}

void Core::finishLanding(LandingImpl& landing, absl::Status status, bool resolved) {
  std::shared_ptr<LandingImpl> keep = landing.shared_from_this();
  // Resolve before completing, so a caller woken by the completion sees resolved().
  if (resolved) resolveLanding(landing);
  if (!landing.completion_.done()) {
    if (status.ok()) {
      stats_.landings_ok.fetch_add(1);
    } else {
      stats_.landings_failed.fetch_add(1);
    }
    landing.completion_.complete(status);
    if (landing.callback) std::exchange(landing.callback, nullptr)(status);
  }
}

void Core::resolveLanding(LandingImpl& landing) {
  if (landing.resolved_.exchange(true)) return;
  std::shared_ptr<LandingImpl> keep = landing.shared_from_this();
  landings_.erase(landing.id_);
  auto it = peers_.find(landing.peer_key);
  if (it != peers_.end()) it->second->landings.erase(&landing);
  landing.region->dropUser();
}

void Core::cancelLanding(LandingImpl* landing) {
  // The sender may still be writing: cancelled but quarantined until it completes or dies.
  finishLanding(*landing, absl::CancelledError("landing cancelled by the receiver"), false);
}

void Core::dismissLanding(LandingImpl* landing) {
  // The caller knows from its control channel that no put was posted for this landing.
  finishLanding(*landing, absl::CancelledError("landing dismissed: the sender posted no put"),
                true);
}

void Core::onNotice(const void* header, size_t header_len, const void* data, size_t len) {
  static log::RateLimitedLog bad_notice;
  NoticeHeader h{};
  if (header_len != sizeof(h)) {
    stats_.notices_refused.fetch_add(1);
    bad_notice.warn("transport: malformed completion notice", "header_bytes", header_len);
    return;
  }
  std::memcpy(&h, header, sizeof(h));
  if (h.magic != kNoticeMagic || h.count > options_.max_blocks_per_put ||
      len != size_t(h.count) * sizeof(NoticeBlock)) {
    stats_.notices_refused.fetch_add(1);
    bad_notice.warn("transport: malformed completion notice", "count", h.count, "bytes", len);
    return;
  }
  auto it = landings_.find(h.landing_id);
  if (it == landings_.end()) {
    stats_.notices_refused.fetch_add(1);
    bad_notice.warn("transport: completion notice for an unknown landing", "id", h.landing_id);
    return;
  }
  std::shared_ptr<LandingImpl> landing = it->second;
  std::vector<NoticeBlock> blocks(h.count);
  if (len > 0) std::memcpy(blocks.data(), data, len);
  bool mismatch = false;
  absl::Status status = verifyNotice(landing->spec, blocks, (h.flags & kNoticeHasChecksums) != 0,
                                     landing->region->bytes(), landing->region->base(), &mismatch);
  if (mismatch) stats_.checksum_mismatches.fetch_add(1);
  if (status.ok()) landing->landed_.store(static_cast<uint32_t>(blocks.size()));
  // The notice follows the flush on the same endpoint: every write of the batch has landed.
  finishLanding(*landing, status, true);
}

absl::Status verifyNotice(const LandingSpec& spec, const std::vector<NoticeBlock>& blocks,
                          bool has_checksums, const void* region_data, uint64_t region_base,
                          bool* checksum_mismatch) {
  *checksum_mismatch = false;
  const auto& expected = spec.blocks;
  const bool prefix_ok = spec.allow_prefix && !blocks.empty() && blocks.size() <= expected.size();
  if (blocks.size() != expected.size() && !prefix_ok) {
    return absl::DataLossError(
        strCat("sender reported ", blocks.size(), " blocks, expected ", expected.size()));
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].remote_addr != expected[i].remote_addr ||
        blocks[i].length != expected[i].length) {
      return absl::DataLossError(strCat("block ", i, ": sender wrote [", blocks[i].remote_addr,
                                        ", +", blocks[i].length, "), expected [",
                                        expected[i].remote_addr, ", +", expected[i].length, ")"));
    }
  }
  if (!spec.verify_checksums) return absl::OkStatus();
  if (!has_checksums) return absl::DataLossError("checksums required but the sender sent none");
  const auto* base = static_cast<const char*>(region_data);
  for (size_t i = 0; i < blocks.size(); ++i) {
    uint64_t got = blockChecksum(base + (blocks[i].remote_addr - region_base), blocks[i].length);
    if (got != blocks[i].checksum) {
      *checksum_mismatch = true;
      return absl::DataLossError(strCat("block ", i, " at ", blocks[i].remote_addr,
                                        ": checksum mismatch (sender ", blocks[i].checksum,
                                        ", landed ", got, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvf::transport
