#include "tests/fakes/fake_engine_adapter.h"

#include <algorithm>
#include <thread>

#include <boost/asio/post.hpp>

#include "worker/block_payload.h"

namespace kvf::fakes {

using worker::BlockHash;
using worker::BlockIndex;

FakeEngineAdapter::FakeEngineAdapter(int64_t block_size, uint64_t block_bytes, uint64_t num_blocks)
    : geometry_{block_size, block_bytes, num_blocks}, payload_(block_bytes * num_blocks) {
  engine_thread_ = onEngine([] { return std::this_thread::get_id(); });
}

FakeEngineAdapter::~FakeEngineAdapter() {
  engine_.stop();
  tier_push_.reset();
}

void FakeEngineAdapter::attachTiers(worker::TieredStore& store) {
  tier_push_ = std::make_unique<worker::TierPushSource>(store);
}

size_t FakeEngineAdapter::pinnedTierRuns() {
  return onEngine([&] { return tier_push_ != nullptr ? tier_push_->pinnedRuns() : size_t{0}; });
}

worker::PayloadRegion FakeEngineAdapter::tierRegion() const {
  return tier_push_ != nullptr ? tier_push_->region() : worker::PayloadRegion{};
}

worker::TierPushRun FakeEngineAdapter::pinTierRun(
    std::span<const BlockHash> hashes, std::span<const std::span<std::byte>> disk_buffers,
    absl::AnyInvocable<void(size_t) &&> on_disk_read) {
  onEngineThreadCheck("pinTierRun");
  if (tier_push_ == nullptr) {
    return EngineAdapter::pinTierRun(hashes, disk_buffers, std::move(on_disk_read));
  }
  return tier_push_->pin(hashes, disk_buffers, std::move(on_disk_read));
}

void FakeEngineAdapter::unpinTierRun(uint64_t id) {
  onEngineThreadCheck("unpinTierRun");
  if (tier_push_ != nullptr) tier_push_->unpin(id);
}

std::span<std::byte> FakeEngineAdapter::blockBytes(BlockIndex b) {
  return {payload_.data() + b * geometry_.block_bytes, geometry_.block_bytes};
}

void FakeEngineAdapter::store(BlockHash hash, BlockIndex block) {
  onEngine([&] {
    worker::fillBlockPayload(hash, blockBytes(block));
    std::lock_guard lock(mu_);
    table_[hash.value()] = block;
    return true;
  });
}

void FakeEngineAdapter::expectFetch(const std::string& id, std::vector<BlockHash> hashes,
                                    std::vector<BlockIndex> blocks) {
  onEngine([&] {
    for (BlockIndex b : blocks) std::fill_n(blockBytes(b).begin(), geometry_.block_bytes, kMarker);
    std::lock_guard lock(mu_);
    FetchRecord& r = fetches_[id];
    r.hashes = hashes;
    r.blocks = blocks;
    return true;
  });
}

FakeEngineAdapter::FetchRecord FakeEngineAdapter::waitFor(
    const std::string& id, std::chrono::milliseconds timeout,
    const std::function<bool(const FetchRecord&)>& done) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard lock(mu_);
      if (done(fetches_[id])) return fetches_[id];
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return record(id);
}

FakeEngineAdapter::FetchRecord FakeEngineAdapter::waitReleased(const std::string& id,
                                                               std::chrono::milliseconds timeout) {
  return waitFor(id, timeout, [](const FetchRecord& r) { return r.released; });
}

FakeEngineAdapter::FetchRecord FakeEngineAdapter::waitCompleted(const std::string& id,
                                                                std::chrono::milliseconds timeout) {
  return waitFor(id, timeout, [](const FetchRecord& r) { return r.completed.has_value(); });
}

FakeEngineAdapter::FetchRecord FakeEngineAdapter::record(const std::string& id) {
  std::lock_guard lock(mu_);
  return fetches_[id];
}

bool FakeEngineAdapter::markersIntact() {
  return onEngine([&] {
    std::lock_guard lock(mu_);
    for (BlockIndex b : released_blocks_) {
      auto bytes = blockBytes(b);
      if (std::any_of(bytes.begin(), bytes.end(), [](std::byte x) { return x != kMarker; })) {
        return false;
      }
    }
    for (const auto& [hash, b] : taken_) {
      if (!worker::verifyBlockPayload(hash, blockBytes(b))) return false;
    }
    return true;
  });
}

uint32_t FakeEngineAdapter::pins(BlockHash hash) {
  std::lock_guard lock(mu_);
  auto it = pins_.find(hash.value());
  return it == pins_.end() ? 0 : it->second;
}

uint32_t FakeEngineAdapter::totalPins() {
  std::lock_guard lock(mu_);
  uint32_t n = 0;
  for (const auto& [h, p] : pins_) n += p;
  return n;
}

void FakeEngineAdapter::setClock(Nanos now) { clock_.store(now); }

worker::PayloadRegion FakeEngineAdapter::payloadRegion() const {
  return {const_cast<std::byte*>(payload_.data()), payload_.size()};
}

Nanos FakeEngineAdapter::now() const { return clock_.load(); }

void FakeEngineAdapter::post(absl::AnyInvocable<void() &&> fn) {
  posted_.fetch_add(1);
  boost::asio::post(engine_.context(), [fn = std::move(fn)]() mutable { std::move(fn)(); });
}

void FakeEngineAdapter::haltWhen(std::shared_future<void> resume) {
  boost::asio::post(engine_.context(), [this, resume] {
    resume.wait();
    engine_.context().stop();
  });
}

void FakeEngineAdapter::onEngineThreadCheck(const char* what) {
  if (std::this_thread::get_id() == engine_thread_) return;
  std::lock_guard lock(mu_);
  fetches_["<engine thread>"].violations.push_back(std::string(what) + " off the engine thread");
}

std::vector<BlockIndex> FakeEngineAdapter::pinLeadingRun(std::span<const BlockHash> hashes) {
  onEngineThreadCheck("pinLeadingRun");
  std::lock_guard lock(mu_);
  std::vector<BlockIndex> run;
  for (BlockHash h : hashes) {
    auto it = table_.find(h.value());
    if (it == table_.end()) break;
    ++pins_[h.value()];
    run.push_back(it->second);
  }
  return run;
}

void FakeEngineAdapter::unpin(std::span<const BlockHash> hashes) {
  onEngineThreadCheck("unpin");
  std::lock_guard lock(mu_);
  for (BlockHash h : hashes) {
    uint32_t& p = pins_[h.value()];
    if (p == 0) {
      fetches_["<pins>"].violations.push_back("unpin of an unpinned block");
      continue;
    }
    --p;
  }
}

void FakeEngineAdapter::completeRemoteKv(const worker::RemoteKvOutcome& outcome) {
  onEngineThreadCheck("completeRemoteKv");
  std::lock_guard lock(mu_);
  FetchRecord& r = fetches_[outcome.id];
  if (r.completed) r.violations.push_back("second outcome");
  if (outcome.landed == 0) r.violations.push_back("complete with nothing landed");
  if (outcome.writes_may_arrive) r.violations.push_back("complete while writes may arrive");
  r.completed = outcome;
  for (size_t i = 0; i < r.blocks.size(); ++i) {
    if (i < outcome.landed) {
      taken_.emplace_back(r.hashes[i], r.blocks[i]);
    } else {
      released_blocks_.push_back(r.blocks[i]);  // freed at once: no write can reach them
    }
  }
}

void FakeEngineAdapter::failRemoteKv(const worker::RemoteKvOutcome& outcome) {
  onEngineThreadCheck("failRemoteKv");
  std::lock_guard lock(mu_);
  FetchRecord& r = fetches_[outcome.id];
  if (r.completed) r.violations.push_back("second outcome");
  if (outcome.landed != 0) r.violations.push_back("fail with blocks landed");
  r.completed = outcome;
  r.failed = true;
  // Without late writes the blocks are free now; else they wait for releaseLanding.
  if (!outcome.writes_may_arrive) {
    released_blocks_.insert(released_blocks_.end(), r.blocks.begin(), r.blocks.end());
  }
}

void FakeEngineAdapter::releaseLanding(const std::string& id) {
  onEngineThreadCheck("releaseLanding");
  std::lock_guard lock(mu_);
  FetchRecord& r = fetches_[id];
  if (!r.completed) r.violations.push_back("release before the outcome");
  if (r.released) r.violations.push_back("second release");
  r.released = true;
  if (r.completed && r.failed && r.completed->writes_may_arrive) {
    released_blocks_.insert(released_blocks_.end(), r.blocks.begin(), r.blocks.end());
  }
  // Reuse: the engine writes into what it got back; a late write would show up here.
  for (size_t i = r.completed ? r.completed->landed : 0; i < r.blocks.size(); ++i) {
    std::fill_n(blockBytes(r.blocks[i]).begin(), geometry_.block_bytes, kMarker);
  }
}

}  // namespace kvf::fakes
