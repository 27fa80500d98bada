#include "worker/tiers/disk_tier.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "worker/tiers/disk_format.h"
#include "worker/tiers/disk_tier_internal.h"

namespace kvf::worker {

SectorBuffer allocateSectors(uint64_t bytes) {
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kDiskSector, bytes));
  if (p != nullptr) std::memset(p, 0, bytes);
  return SectorBuffer(p);
}

namespace {

absl::Status validate(const DiskTierOptions& o) {
  std::vector<std::string> problems;
  if (o.dir.empty()) problems.push_back("dir is empty");
  if (o.block_bytes == 0) problems.push_back("block_bytes is 0");
  if (o.queue_depth == 0 || o.queue_depth > 1024)
    problems.push_back("queue_depth not in [1, 1024]");
  if (o.max_queued_writes == 0) problems.push_back("max_queued_writes is 0");
  if (o.block_bytes > 0 && o.capacity_bytes < diskSlotBytes(o.block_bytes)) {
    problems.push_back(strCat("capacity_bytes ", o.capacity_bytes, " holds no slot of ",
                              diskSlotBytes(o.block_bytes), " bytes"));
  }
  if (o.block_bytes > (1ULL << 30)) problems.push_back("block_bytes above 1 GiB");
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(strCat("disk tier: ", strJoin(problems, "; ")));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::create(const DiskTierOptions& options,
                                                           TierCounters* counters,
                                                           TierListener* listener) {
  if (auto s = validate(options); !s.ok()) return s;
  uint64_t slot_bytes = diskSlotBytes(options.block_bytes);
  uint64_t per_file = std::max<uint64_t>(1, options.file_bytes / slot_bytes);
  uint64_t total = options.capacity_bytes / slot_bytes;
  if (total > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(strCat("disk tier: ", total, " slots is too many"));
  }
  std::vector<uint64_t> sizes;
  for (uint64_t first = 0; first < total; first += per_file) {
    sizes.push_back(slabFileBytes(std::min(per_file, total - first), per_file,
                                  roundUpToSector(options.block_bytes)));
  }
  DiskGeometry geometry{options.block_bytes, slot_bytes, per_file};
  auto opened = SlabFiles::open(options.dir, geometry, std::move(sizes), options.direct_io,
                                options.on_start == DiskStart::kRebuild);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<DiskTier> tier(
      new DiskTier(options, std::move(opened->files), counters, listener));
  if (auto s = tier->start(opened->kept, opened->reason); !s.ok()) return s;
  return tier;
}

DiskTier::DiskTier(const DiskTierOptions& options, std::unique_ptr<SlabFiles> files,
                   TierCounters* counters, TierListener* listener)
    : options_(options),
      block_bytes_(options.block_bytes),
      padded_bytes_(roundUpToSector(options.block_bytes)),
      slot_bytes_(diskSlotBytes(options.block_bytes)),
      slots_per_file_(std::max<uint64_t>(1, options.file_bytes / slot_bytes_)),
      files_(std::move(files)),
      counters_(counters),
      listener_(listener),
      slots_(options.capacity_bytes / slot_bytes_),
      lru_(slots_.size()) {
  index_.reserve(slots_.size());
}

uint32_t DiskTier::fileOf(int32_t slot) const {
  return static_cast<uint32_t>(static_cast<uint64_t>(slot) / slots_per_file_);
}

uint64_t DiskTier::headerOffsetOf(int32_t slot) const {
  return headerOffset(static_cast<uint64_t>(slot) % slots_per_file_);
}

uint64_t DiskTier::payloadOffsetOf(int32_t slot) const {
  return payloadOffset(static_cast<uint64_t>(slot) % slots_per_file_, slots_per_file_,
                       padded_bytes_);
}

uint64_t DiskTier::slotsIn(uint32_t file) const {
  return (files_->fileBytes(file) - slots_per_file_ * kDiskSector) / padded_bytes_;
}

absl::Status DiskTier::start(bool rebuild, std::string reason) {
  auto ring = std::make_unique<Ring>();
  unsigned entries = 3 * options_.queue_depth + 2;  // a write is two requests
  if (int rc = io_uring_queue_init(entries, &ring->ring, 0); rc < 0) {
    ring.release();  // nothing to tear down: init failed
    return errnoToStatus(-rc, "io_uring_queue_init");
  }
  ring_ = std::move(ring);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return errnoToStatus(errno, "eventfd");
  for (uint32_t i = 0; i < 2 * options_.queue_depth; ++i) {
    auto op = std::make_unique<Op>();
    op->header = allocateSectors(kDiskSector);
    if (op->header == nullptr) return absl::ResourceExhaustedError("disk tier: out of memory");
    free_ops_.push_back(op.get());
    ops_.push_back(std::move(op));
  }
  start_.direct_io = files_->directIo();
  start_.reason = std::move(reason);
  start_.action = rebuild ? DiskStart::kRebuild : DiskStart::kClear;
  if (rebuild) KVF_RETURN_IF_ERROR(rebuildIndex());
  if (options_.preallocate == Preallocate::kEager) {
    for (uint32_t f = 0; f < files_->fileCount(); ++f) {
      if (files_->fd(f) >= 0) continue;
      if (auto s = files_->allocate(f); !s.ok()) {
        return absl::Status(
            s.code(), strCat("disk tier: preallocating ", files_->fileCount(), " slab files for ",
                             options_.capacity_bytes, " bytes: ", std::string(s.message())));
      }
    }
  }
  // Free slots of allocated files, lowest first, so a fresh tier fills its files in order.
  for (int32_t i = static_cast<int32_t>(slots_.size()) - 1; i >= 0; --i) {
    if (files_->fd(fileOf(i)) < 0) continue;
    ++allocated_slots_;
    if (slots_[i].state == SlotState::kFree) free_.push_back(i);
  }
  if (listener_ != nullptr) {
    if (rebuild) {
      std::vector<BlockKey> recovered = keys();
      if (!recovered.empty()) listener_->onStored(TierId::kDisk, recovered);
    } else {
      listener_->onCleared(TierId::kDisk);
    }
  }
  log::info("disk tier started", "dir", options_.dir, "action", rebuild ? "rebuild" : "clear",
            "reason", start_.reason, "recovered", start_.recovered_blocks, "invalid",
            start_.invalid_slots, "direct_io", start_.direct_io);
  thread_ = std::thread([this] { run(); });
  return absl::OkStatus();
}

// Reads the header sectors of every allocated slab file (they lie together at its start) in
// large reads, before the I/O thread starts. The newest copy of a key wins; the payload is
// checked when it is read.
absl::Status DiskTier::rebuildIndex() {
  constexpr uint64_t kChunkSectors = 256;
  SectorBuffer chunk = allocateSectors(kChunkSectors * kDiskSector);
  if (chunk == nullptr) return absl::ResourceExhaustedError("disk tier: out of memory");
  std::vector<uint64_t> sequence(slots_.size(), 0);
  for (uint32_t f = 0; f < files_->fileCount(); ++f) {
    int fd = files_->fd(f);
    if (fd < 0) continue;
    uint64_t slots = slotsIn(f);
    for (uint64_t first = 0; first < slots; first += kChunkSectors) {
      uint64_t n = std::min(kChunkSectors, slots - first);
      ssize_t got =
          ::pread(fd, chunk.get(), n * kDiskSector, static_cast<off_t>(first * kDiskSector));
      if (got != static_cast<ssize_t>(n * kDiskSector)) {
        return got < 0 ? errnoToStatus(errno, strCat("rebuild: reading ", slabFileName(f)))
                       : absl::DataLossError(strCat("rebuild: short read of ", slabFileName(f)));
      }
      for (uint64_t k = 0; k < n; ++k) {
        auto slot = static_cast<int32_t>(f * slots_per_file_ + first + k);
        std::span<const std::byte> sector(chunk.get() + k * kDiskSector, kDiskSector);
        auto header = decodeSlotHeader(sector);
        if (!header || header->payload_bytes != block_bytes_) {
          bool blank = std::all_of(sector.begin(), sector.begin() + 64,
                                   [](std::byte b) { return b == std::byte{0}; });
          if (!blank) ++start_.invalid_slots;
          continue;
        }
        auto [it, fresh] = index_.try_emplace(header->key, slot);
        if (!fresh) {
          if (sequence[it->second] >= header->sequence) continue;
          slots_[it->second] = Slot{};
          it->second = slot;
        }
        slots_[slot] = Slot{header->key, header->checksum, 0, SlotState::kResident, false};
        sequence[slot] = header->sequence;
        sequence_ = std::max(sequence_, header->sequence + 1);
      }
    }
  }
  // LRU order from the write sequence: the newest block is the most recent.
  std::vector<int32_t> resident;
  for (const auto& [key, slot] : index_) resident.push_back(slot);
  std::sort(resident.begin(), resident.end(),
            [&](int32_t a, int32_t b) { return sequence[a] < sequence[b]; });
  for (int32_t slot : resident) lru_.pushFront(slot);
  start_.recovered_blocks = resident.size();
  return absl::OkStatus();
}

DiskTier::~DiskTier() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake();
    thread_.join();
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void DiskTier::wake() {
  if (wake_armed_.exchange(true)) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

absl::Status DiskTier::write(BlockKey key, std::span<const std::byte> payload, uint64_t checksum,
                             Done done) {
  if (payload.size() < block_bytes_) {
    return absl::InvalidArgumentError(
        strCat("disk tier: payload of ", payload.size(), " bytes, blocks are ", block_bytes_));
  }
  bool wake_io = false;
  {
    std::lock_guard lock(mu_);
    if (stop_) return absl::CancelledError("disk tier is stopping");
    if (index_.contains(key)) return absl::AlreadyExistsError("disk tier: block already on disk");
    if (accepted_writes_ >= options_.max_queued_writes) {
      return absl::UnavailableError(
          strCat("disk tier: ", accepted_writes_, " writes queued (max_queued_writes)"));
    }
    pending_writes_.push_back({key, payload, checksum, std::move(done), clock_.now()});
    ++accepted_writes_;
    ++writing_keys_[key];
    // The I/O thread needs to hear of a new batch (to time it) and of a full one.
    uint64_t waiting = pending_writes_.size() - released_writes_;
    wake_io = waiting == 1 || waiting * block_bytes_ >= options_.batch_bytes ||
              accepted_writes_ >= options_.max_queued_writes;
  }
  if (wake_io) wake();
  return absl::OkStatus();
}

void DiskTier::read(BlockKey key, std::span<std::byte> out, Done done, bool promotion) {
  if (out.size() < block_bytes_) {
    std::move(done)(absl::InvalidArgumentError(
        strCat("disk tier: read buffer of ", out.size(), " bytes, blocks are ", block_bytes_)));
    return;
  }
  bool wake_io = false;
  {
    std::unique_lock lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end() || stop_) {
      lock.unlock();
      std::move(done)(absl::NotFoundError("disk tier: block not on disk"));
      return;
    }
    Slot& s = slots_[it->second];
    ++s.pins;
    // With reads already waiting, or every read slot busy, the I/O thread takes this one when it
    // next runs anyway (a wakeup or a completion is on its way): no eventfd write needed.
    wake_io = pending_reads_.empty() && reads_in_flight_ < options_.queue_depth;
    pending_reads_.push_back({key, it->second, s.checksum, out, std::move(done), promotion});
  }
  if (wake_io) wake();
}

bool DiskTier::remove(BlockKey key, bool count_drop) {
  bool found = false;
  {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      dropLocked(it->second, count_drop ? std::optional(DropReason::kRemoved) : std::nullopt);
      found = true;
    }
    if (writing_keys_.contains(key)) {
      cancelled_keys_[key] = true;
      found = true;
    }
  }
  if (found) wake();  // a freed slot may unblock queued writes
  return found;
}

bool DiskTier::contains(BlockKey key) const {
  std::lock_guard lock(mu_);
  return index_.contains(key);
}

std::vector<BlockKey> DiskTier::keys() const {
  std::lock_guard lock(mu_);
  std::vector<BlockKey> out;
  out.reserve(index_.size());
  for (int32_t i = lru_.back(); i != SlotList::kNone; i = lru_.prev(i))
    out.push_back(slots_[i].key);
  return out;
}

bool DiskTier::drain(std::chrono::nanoseconds timeout) {
  std::unique_lock lock(mu_);
  draining_ = true;
  wake();
  bool done = drained_cv_.wait_for(lock, timeout, [&] { return accepted_writes_ == 0; });
  draining_ = false;
  return done;
}

size_t DiskTier::queuedWrites() const {
  std::lock_guard lock(mu_);
  return accepted_writes_;
}

size_t DiskTier::blocks() const {
  std::lock_guard lock(mu_);
  return index_.size();
}

size_t DiskTier::allocatedBlocks() const {
  std::lock_guard lock(mu_);
  return allocated_slots_;
}

void DiskTier::dropLocked(int32_t slot, std::optional<DropReason> reason) {
  Slot& s = slots_[slot];
  if (reason) counters_->drop(*reason);
  if (listener_ != nullptr) listener_->onRemoved(TierId::kDisk, {&s.key, 1});
  index_.erase(s.key);
  lru_.remove(slot);
  if (s.pins > 0) {
    s.doomed = true;
  } else {
    freeSlotLocked(slot);
  }
}

void DiskTier::unpinLocked(int32_t slot) {
  Slot& s = slots_[slot];
  --s.pins;
  if (s.pins == 0 && s.doomed) freeSlotLocked(slot);
}

void DiskTier::freeSlotLocked(int32_t slot) {
  slots_[slot] = Slot{};
  free_.push_back(slot);
}

}  // namespace kvf::worker
