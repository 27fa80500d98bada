#include "worker/tiers/tiered_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "common/status.h"
#include "common/strings.h"
#include "worker/tiers/pinned_arena.h"

namespace kvf::worker {

OnboardTicket::OnboardTicket(size_t blocks, BlockCallback on_block)
    : states_(blocks),
      sources_(blocks, TierId::kHost),
      on_block_(std::move(on_block)),
      pending_(blocks) {}

size_t OnboardTicket::readyPrefix() const {
  size_t n = 0;
  while (n < states_.size() && state(n) == OnboardState::kReady) ++n;
  return n;
}

bool OnboardTicket::done() const {
  std::lock_guard lock(mu_);
  return pending_ == 0;
}

bool OnboardTicket::wait(size_t i, std::chrono::nanoseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return state(i) != OnboardState::kPending; });
}

bool OnboardTicket::waitAll(std::chrono::nanoseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return pending_ == 0; });
}

void OnboardTicket::finish(size_t i, OnboardState state, TierId source) {
  sources_[i] = source;
  states_[i].store(state, std::memory_order_release);
  if (on_block_) on_block_(i, state);
  std::lock_guard lock(mu_);
  --pending_;
  cv_.notify_all();
}

absl::StatusOr<std::unique_ptr<TieredStore>> TieredStore::create(TieredStoreOptions options,
                                                                 TierListener* listener) {
  options.host.has_lower_tier = options.disk.has_value();
  if (options.disk) {
    if (options.disk->block_bytes == 0) options.disk->block_bytes = options.host.block_bytes;
    if (options.disk->block_bytes != options.host.block_bytes) {
      return absl::InvalidArgumentError(
          strCat("tiers: disk block_bytes ", options.disk->block_bytes,
                 " differs from host block_bytes ", options.host.block_bytes));
    }
  }
  std::unique_ptr<TieredStore> store(new TieredStore(std::move(options)));
  const TieredStoreOptions& o = store->options_;
  auto host = HostTier::create(o.host, &store->counters_, listener, &store->clock_);
  if (!host.ok()) return host.status();
  store->host_ = std::move(*host);
  if (o.disk) {
    auto disk = DiskTier::create(*o.disk, &store->counters_, listener);
    if (!disk.ok()) return disk.status();
    store->disk_ = std::move(*disk);
    store->offloader_ = std::thread([s = store.get()] { s->runOffloader(); });
  }
  return store;
}

TieredStore::TieredStore(TieredStoreOptions options)
    : options_(std::move(options)),
      copiers_(std::make_unique<boost::asio::thread_pool>(
          std::max<uint32_t>(1, options_.onboard_threads))) {}

TieredStore::~TieredStore() {
  {
    std::lock_guard lock(offload_mu_);
    stop_ = true;
  }
  offload_cv_.notify_all();
  if (offloader_.joinable()) offloader_.join();
  copiers_->join();  // posted copies finish (they may read from disk)
  disk_.reset();     // its completions call into host_
}

absl::Status TieredStore::offload(BlockKey key, std::span<const std::byte> bytes) {
  if (bytes.size() != host_->blockBytes()) {
    return absl::InvalidArgumentError(
        strCat("tiers: offload of ", bytes.size(), " bytes, blocks are ", host_->blockBytes()));
  }
  // A plain copy: the checksum is computed by the offloader, off the engine's eviction path.
  return offloadInto(key, [&](std::span<std::byte> slot) {
    std::memcpy(slot.data(), bytes.data(), bytes.size());
    return absl::OkStatus();
  });
}

absl::Status TieredStore::offloadInto(BlockKey key,
                                      absl::FunctionRef<absl::Status(std::span<std::byte>)> fill) {
  auto reserved = beginOffload(key);
  if (!reserved.ok()) {
    if (absl::IsAlreadyExists(reserved.status())) return absl::OkStatus();
    return reserved.status();
  }
  absl::Status filled = fill(reserved->bytes);
  endOffload(*reserved, filled.ok());
  return filled;
}

absl::StatusOr<HostTier::Reservation> TieredStore::beginOffload(BlockKey key) {
  return host_->reserve(key);
}

void TieredStore::endOffload(const HostTier::Reservation& reservation, bool filled) {
  if (!filled) {
    host_->abort(reservation);
    return;
  }
  // Checked now, not at reserve time: the disk may have taken the key while the copy ran.
  bool durable_below = disk_ == nullptr || disk_->contains(reservation.key);
  host_->commit(reservation, std::nullopt, durable_below);
  if (!durable_below) pokeOffloader();
}

absl::Status TieredStore::offloadWait(BlockKey key, std::span<const std::byte> bytes,
                                      std::chrono::nanoseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    absl::Status s = offload(key, bytes);
    if (!absl::IsUnavailable(s)) return s;
    auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) return s;
    host_->waitForSpace(left);
  }
}

std::vector<TierId> TieredStore::lookup(std::span<const BlockKey> keys) const {
  std::vector<TierId> tiers;
  for (BlockKey key : keys) {
    if (host_->contains(key)) {
      tiers.push_back(TierId::kHost);
    } else if (disk_ != nullptr && disk_->contains(key)) {
      tiers.push_back(TierId::kDisk);
    } else {
      break;
    }
  }
  return tiers;
}

std::shared_ptr<OnboardTicket> TieredStore::onboard(
    std::span<const BlockKey> keys, std::span<const std::span<std::byte>> destinations,
    OnboardTicket::BlockCallback on_block) {
  auto ticket = std::make_shared<OnboardTicket>(keys.size(), std::move(on_block));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i >= destinations.size() || destinations[i].size() < host_->blockBytes()) {
      ticket->finish(i, OnboardState::kFailed, TierId::kHost);
      continue;
    }
    std::span<std::byte> dst = destinations[i];
    if (auto pin = host_->pin(keys[i])) {
      boost::asio::post(*copiers_,
                        [this, ticket, i, p = *pin, dst] { copyFromHost(ticket, i, p, dst); });
    } else {
      readFromDisk(ticket, i, keys[i], dst);
    }
  }
  if (disk_ != nullptr && options_.host.offload_min_hits > 1) pokeOffloader();  // as in touch()
  return ticket;
}

absl::Status TieredStore::promote(BlockKey key, std::function<void(bool)> done) {
  if (disk_ == nullptr || !disk_->contains(key)) {
    return absl::NotFoundError("tiers: block not on disk");
  }
  // reserve() counts a refusal as offload backpressure: ask it only with a slot to spare.
  if (host_->contains(key)) return absl::AlreadyExistsError("tiers: block in host memory");
  HostTier::Usage usage = host_->usage();
  if (usage.resident >= usage.capacity && usage.evictable == 0) {
    return absl::UnavailableError("tiers: no clean host slot for a promotion");
  }
  KVF_ASSIGN_OR_RETURN(HostTier::Reservation r, host_->reserve(key));
  disk_->read(
      key, r.bytes,
      [this, r, done = std::move(done)](absl::Status s) {
        // Clean when the disk still holds its copy; removed meanwhile, it is written again.
        if (s.ok()) {
          host_->commit(r, std::nullopt, disk_->contains(r.key));
        } else {
          host_->abort(r);
        }
        if (done) done(s.ok());
      },
      /*promotion=*/true);
  return absl::OkStatus();
}

void TieredStore::copyFromHost(const std::shared_ptr<OnboardTicket>& ticket, size_t i,
                               HostTier::Pin pin, std::span<std::byte> dst) {
  bool intact = true;
  if (options_.verify_host_reads && pin.checksum) {
    intact = copyWithChecksum(dst.first(pin.bytes.size()), pin.bytes) == *pin.checksum;
  } else {
    std::memcpy(dst.data(), pin.bytes.data(), pin.bytes.size());
  }
  host_->unpin(pin);
  if (intact) {
    bump(counters_.host_onboarded);
    ticket->finish(i, OnboardState::kReady, TierId::kHost);
    return;
  }
  // Host memory went bad under this block: never serve it; the disk may still hold a good copy.
  host_->drop(pin.key, DropReason::kCorrupt);
  readFromDisk(ticket, i, pin.key, dst);
}

void TieredStore::readFromDisk(const std::shared_ptr<OnboardTicket>& ticket, size_t i, BlockKey key,
                               std::span<std::byte> dst) {
  if (disk_ == nullptr) {
    ticket->finish(i, OnboardState::kMissing, TierId::kDisk);
    return;
  }
  disk_->read(key, dst, [ticket, i](absl::Status s) {
    OnboardState state = s.ok()                ? OnboardState::kReady
                         : absl::IsNotFound(s) ? OnboardState::kMissing
                         : absl::IsDataLoss(s) ? OnboardState::kCorrupt
                                               : OnboardState::kFailed;
    ticket->finish(i, state, TierId::kDisk);
  });
}

void TieredStore::touch(std::span<const BlockKey> keys) {
  host_->touch(keys);
  // A use can make a block the frequency filter held back due for its write.
  if (disk_ != nullptr && options_.host.offload_min_hits > 1) pokeOffloader();
}

bool TieredStore::remove(BlockKey key) {
  bool in_host = host_->drop(key, DropReason::kRemoved);
  bool in_disk = disk_ != nullptr && disk_->remove(key, /*count_drop=*/!in_host);
  return in_host || in_disk;
}

bool TieredStore::flush(std::chrono::nanoseconds timeout) {
  if (disk_ == nullptr) return true;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  host_->setFlushing(true);
  pokeOffloader();
  bool ok = host_->waitWritten(timeout);
  host_->setFlushing(false);
  return ok && disk_->drain(
                   std::max(std::chrono::nanoseconds::zero(),
                            std::chrono::nanoseconds(deadline - std::chrono::steady_clock::now())));
}

void TieredStore::pokeOffloader() {
  {
    std::lock_guard lock(offload_mu_);
    poked_ = true;
  }
  offload_cv_.notify_one();
}

void TieredStore::runOffloader() {
  std::unique_lock lock(offload_mu_);
  while (!stop_) {
    poked_ = false;
    lock.unlock();
    bool queue_full = handWrites();
    std::optional<Nanos> due = queue_full ? std::nullopt : host_->nextWriteDue();
    lock.lock();
    if (stop_ || poked_) continue;
    if (due) {
      auto wait = std::chrono::nanoseconds(std::max<Nanos>(1, *due - clock_.now()));
      offload_cv_.wait_for(lock, wait, [&] { return poked_ || stop_; });
    } else {
      offload_cv_.wait(lock, [&] { return poked_ || stop_; });
    }
  }
}

// Hands due host blocks to the disk until none is due or the disk's queue is full (true).
bool TieredStore::handWrites() {
  using Outcome = HostTier::WriteOutcome;
  while (true) {
    size_t queued = disk_->queuedWrites();
    if (queued >= disk_->maxQueuedWrites()) return true;
    std::vector<HostTier::WriteJob> jobs = host_->takeDirty(disk_->maxQueuedWrites() - queued);
    if (jobs.empty()) return false;
    for (HostTier::WriteJob& job : jobs) {
      if (!job.checksum) {
        job.checksum = blockChecksum(job.bytes.first(host_->blockBytes()));
        host_->setChecksum(job, *job.checksum);
      }
      absl::Status s = disk_->write(job.key, job.bytes, *job.checksum, [this, job](absl::Status r) {
        host_->finishWrite(job, r.ok()                 ? Outcome::kDurable
                                : absl::IsCancelled(r) ? Outcome::kNotTried
                                                       : Outcome::kFailed);
        pokeOffloader();
      });
      if (s.ok()) continue;
      host_->finishWrite(job, absl::IsAlreadyExists(s)                         ? Outcome::kDurable
                              : absl::IsUnavailable(s) || absl::IsCancelled(s) ? Outcome::kNotTried
                                                                               : Outcome::kFailed);
    }
  }
}

TierStats TieredStore::stats() const {
  TierStats s;
  for (size_t r = 0; r < kDropReasonCount; ++r) {
    s.dropped[r] = counters_.dropped[r].load(std::memory_order_relaxed);
  }
  auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  s.host_stored = get(counters_.host_stored);
  s.host_moved_down = get(counters_.host_moved_down);
  s.host_backpressure = get(counters_.host_backpressure);
  s.host_onboarded = get(counters_.host_onboarded);
  s.disk_written = get(counters_.disk_written);
  s.disk_write_errors = get(counters_.disk_write_errors);
  s.disk_onboarded = get(counters_.disk_onboarded);
  s.disk_promoted = get(counters_.disk_promoted);
  s.disk_read_errors = get(counters_.disk_read_errors);
  s.disk_grow_failures = get(counters_.disk_grow_failures);
  s.disk_bytes_written = get(counters_.disk_bytes_written);
  s.disk_bytes_read = get(counters_.disk_bytes_read);
  s.host = host_->usage();
  if (disk_ != nullptr) {
    s.disk_blocks = disk_->blocks();
    s.disk_capacity_blocks = disk_->capacityBlocks();
    s.disk_allocated_blocks = disk_->allocatedBlocks();
    s.disk_queued_writes = disk_->queuedWrites();
  }
  return s;
}

}  // namespace kvf::worker
