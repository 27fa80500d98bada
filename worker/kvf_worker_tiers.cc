#include "worker/kvf_worker_tiers.h"

#include <string_view>
#include <utility>
#include <vector>

namespace kvf::worker {

absl::StatusOr<std::optional<kvf_worker_tiers>> tierTable(const kvf_worker_tiers* tiers,
                                                          uint64_t block_bytes) {
  if (tiers == nullptr) return std::nullopt;
  absl::StatusOr<kvf_worker_tiers> t = fullCStruct(tiers, KVF_WORKER_TIERS_SIZE_V1, "config.tiers");
  if (!t.ok()) return t.status();
  if (t->region == nullptr) return absl::InvalidArgumentError("config.tiers.region: NULL");
  if (t->region_bytes < block_bytes) {
    return absl::InvalidArgumentError(strCat("config.tiers.region_bytes: ", t->region_bytes,
                                             ", less than one block of ", block_bytes, " bytes"));
  }
  const uint64_t buffer = tierPushBufferStride(block_bytes);
  if (t->disk_buffer_bytes != 0 && t->disk_buffer_bytes < buffer) {
    return absl::InvalidArgumentError(
        strCat("config.tiers.disk_buffer_bytes: ", t->disk_buffer_bytes,
               ", less than one buffer of ", buffer, " bytes (0: the default)"));
  }
  if (t->pin_tier_run == nullptr || t->unpin_tier_run == nullptr) {
    return absl::InvalidArgumentError(
        "config.tiers.pin_tier_run, config.tiers.unpin_tier_run: both must be set");
  }
  return std::optional<kvf_worker_tiers>(*t);
}

PayloadRegion CTierSource::region() const {
  return {static_cast<std::byte*>(tiers_.region), tiers_.region_bytes};
}

TierPushRun CTierSource::pin(std::span<const BlockHash> hashes,
                             std::span<const std::span<std::byte>> disk_buffers,
                             absl::AnyInvocable<void(size_t) &&> on_disk_read) {
  uint64_t read_id = 0;
  {
    std::lock_guard lock(mu_);
    read_id = next_read_++;
    reads_.emplace(read_id, PendingRead{std::move(on_disk_read)});
  }
  std::vector<void*> buffers;
  buffers.reserve(disk_buffers.size());
  for (std::span<std::byte> b : disk_buffers) buffers.push_back(b.data());
  std::vector<kvf_tier_block> blocks(hashes.size());
  kvf_tier_run run{};
  run.blocks = blocks.data();
  tiers_.pin_tier_run(tiers_.user, protocol::rawHashes(hashes).data(), hashes.size(),
                      buffers.data(), buffers.size(), read_id, &run);
  size_t claimed = 0;
  TierPushRun out = checkRun(run, blocks.data(), hashes.size(), buffers.size(), &claimed);
  returned(read_id, claimed);
  return out;
}

TierPushRun CTierSource::checkRun(const kvf_tier_run& run, const kvf_tier_block* blocks, size_t n,
                                  size_t num_buffers, size_t* disk_claimed) {
  TierPushRun out;
  out.id = run.id;
  out.out_of_buffers = run.out_of_buffers != 0;
  const size_t len = std::min(run.num_blocks, n);
  // The buffers the engine may be reading into, well formed or not: the agent keeps them out
  // of other pushes' hands until the engine reports the reads.
  *disk_claimed = 0;
  for (size_t i = 0; i < len; ++i) {
    if (blocks[i].tier == KVF_TIER_DISK && blocks[i].offset < num_buffers) {
      *disk_claimed = std::max<size_t>(*disk_claimed, blocks[i].offset + 1);
    }
  }
  std::string_view problem = run.num_blocks > n ? "num_blocks past n" : "";
  size_t disk = 0;
  for (size_t i = 0; i < len && problem.empty(); ++i) {  // stops at the first problem
    const kvf_tier_block& b = blocks[i];
    if (b.tier == KVF_TIER_HOST) {
      if (b.offset > tiers_.region_bytes || tiers_.region_bytes - b.offset < block_bytes_) {
        problem = "a host block's offset is outside the region";
        continue;
      }
      out.blocks.push_back({TierId::kHost, b.offset});
    } else if (b.tier == KVF_TIER_DISK) {
      if (b.offset != disk || disk >= num_buffers) {
        problem = "a disk block's buffer index is out of order or past the buffers";
        continue;
      }
      out.blocks.push_back({TierId::kDisk, b.offset});
      ++disk;
    } else {
      problem = "a block's tier is neither KVF_TIER_HOST nor KVF_TIER_DISK";
    }
  }
  out.disk = *disk_claimed;
  if (!problem.empty()) {
    malformed_log_.warn("pin_tier_run filled in a malformed run; the rest is answered missing",
                        "problem", problem, "served", out.blocks.size(), "num_blocks",
                        run.num_blocks);
  }
  return out;
}

void CTierSource::returned(uint64_t read_id, size_t disk) {
  absl::AnyInvocable<void(size_t) &&> done;
  size_t intact = 0;
  {
    std::lock_guard lock(mu_);
    auto it = reads_.find(read_id);
    if (it == reads_.end()) return;
    it->second.returned = true;
    it->second.disk = disk;
    if (disk > 0 && !it->second.intact.has_value()) return;  // the engine reports it later
    intact = std::min(it->second.intact.value_or(0), disk);
    done = std::move(it->second.on_done);
    reads_.erase(it);
  }
  std::move(done)(intact);
}

absl::Status CTierSource::readDone(uint64_t read_id, size_t intact) {
  absl::AnyInvocable<void(size_t) &&> done;
  {
    std::lock_guard lock(mu_);
    auto it = reads_.find(read_id);
    if (it == reads_.end() || it->second.intact.has_value()) {
      return absl::NotFoundError(strCat("read_id: ", read_id,
                                        " is no disk read in progress (unknown, already "
                                        "reported, or its run has no disk block)"));
    }
    if (!it->second.returned) {  // reported from inside pin_tier_run: finished on its return
      it->second.intact = intact;
      return absl::OkStatus();
    }
    intact = std::min(intact, it->second.disk);
    done = std::move(it->second.on_done);
    reads_.erase(it);
  }
  std::move(done)(intact);
  return absl::OkStatus();
}

void CTierSource::unpin(uint64_t id) {
  if (id != 0) tiers_.unpin_tier_run(tiers_.user, id);
}

void CTierSource::dropReads() {
  absl::flat_hash_map<uint64_t, PendingRead> dropped;
  {
    std::lock_guard lock(mu_);
    dropped.swap(reads_);
  }
}

}  // namespace kvf::worker
