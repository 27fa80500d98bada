#include "engine/device_tiers.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "transport/cuda_status.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::engine {
namespace {

absl::Status cudaCheck(cudaError_t error, std::string_view what) {
  return transport::cudaStatus(error, strCat("device tiers: ", what));
}

}  // namespace

// One onboard into the device pool: a head copied by the DeviceCopier straight from host slots,
// then a tail the store reads into bounce slots, each block copied to the device once the store
// has it (in order: the tail's ready prefix is what its copies' events cover). Engine thread.
class DeviceTierOnboard final : public TierOnboard {
 public:
  DeviceTierOnboard(DeviceTiers& tiers, std::shared_ptr<worker::DeviceOnboard> head)
      : tiers_(tiers), head_(std::move(head)), head_size_(head_ ? head_->size() : 0) {}
  ~DeviceTierOnboard() override;

  bool done() const override;
  size_t readyPrefix() const override;

 private:
  friend class DeviceTiers;
  // Queues the device copies of the tail blocks the store has delivered since the last call.
  void advanceTail() const;

  DeviceTiers& tiers_;
  std::shared_ptr<worker::DeviceOnboard> head_;
  const size_t head_size_;
  std::shared_ptr<worker::OnboardTicket> tail_;
  std::vector<std::span<std::byte>> bounce_;
  std::vector<void*> tail_dst_;
  // Progress is driven from the const queries the engine polls.
  struct Copied {
    size_t blocks;  // tail blocks covered once `event` fired
    cudaEvent_t event;
  };
  mutable std::vector<Copied> copies_;
  mutable size_t issued_ = 0;       // tail blocks whose copy is queued
  mutable size_t copies_done_ = 0;  // leading copies_ whose event fired
  mutable bool failed_ = false;     // a copy could not be queued: the tail stops there
};

DeviceTierOnboard::~DeviceTierOnboard() {
  // The engine waits for done() first; this only guards an early destruction.
  if (tail_ != nullptr) tail_->waitAll(std::chrono::seconds(30));
  for (const Copied& c : copies_) {
    cudaEventSynchronize(c.event);
    cudaEventDestroy(c.event);
  }
  tiers_.giveBounce(bounce_);
}

void DeviceTierOnboard::advanceTail() const {
  if (tail_ == nullptr || failed_) return;
  const size_t ready = std::min(tail_->readyPrefix(), tail_dst_.size());
  if (ready > issued_) {
    cudaStream_t stream = tiers_.copier_->onboardStream();
    absl::Status s;
    for (size_t i = issued_; i < ready && s.ok(); ++i) {
      s = cudaCheck(cudaMemcpyAsync(tail_dst_[i], bounce_[i].data(), bounce_[i].size(),
                                    cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync");
    }
    cudaEvent_t event = nullptr;
    if (s.ok()) {
      s = cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    }
    if (s.ok()) s = cudaCheck(cudaEventRecord(event, stream), "cudaEventRecord");
    if (!s.ok()) {
      // Queued copies may still read the bounce slots: done() waits for the stream's work.
      log::error("device tiers: onboard copy failed", "error", std::string(s.message()));
      if (event != nullptr) cudaEventDestroy(event);
      cudaStreamSynchronize(stream);
      failed_ = true;
      return;
    }
    copies_.push_back({ready, event});
    issued_ = ready;
  }
  while (copies_done_ < copies_.size() &&
         cudaEventQuery(copies_[copies_done_].event) == cudaSuccess) {
    ++copies_done_;
  }
}

size_t DeviceTierOnboard::readyPrefix() const {
  size_t head = head_ != nullptr ? head_->readyPrefix() : 0;
  if (head < head_size_) return head;
  advanceTail();
  return head_size_ + (copies_done_ > 0 ? copies_[copies_done_ - 1].blocks : 0);
}

bool DeviceTierOnboard::done() const {
  if (head_ != nullptr && !head_->done()) {
    tiers_.copier_->poll();  // retires the head once its copies completed
    if (!head_->done()) return false;
  }
  if (tail_ == nullptr) return true;
  const bool tail_done = tail_->done();  // before advancing, so the advance sees every block
  advanceTail();
  if (!tail_done) return false;
  if (failed_) return true;
  return issued_ == std::min(tail_->readyPrefix(), tail_dst_.size()) &&
         copies_done_ == copies_.size();
}

absl::StatusOr<std::unique_ptr<DeviceTiers>> DeviceTiers::create(
    DeviceTiersOptions options, std::shared_ptr<DevicePayload> memory) {
  if (memory == nullptr) return absl::InvalidArgumentError("device tiers: no device pool");
  if (options.live.store.host.block_bytes != memory->blockBytes()) {
    return absl::InvalidArgumentError(strCat("device tiers: host blocks of ",
                                             options.live.store.host.block_bytes,
                                             " bytes for pool blocks of ", memory->blockBytes()));
  }
  std::unique_ptr<DeviceTiers> tiers(new DeviceTiers(std::move(options), std::move(memory)));
  KVF_RETURN_IF_ERROR(tiers->init());
  return tiers;
}

absl::Status DeviceTiers::init() {
  KVF_ASSIGN_OR_RETURN(live_, LiveTiers::create(options_.live));
  KVF_ASSIGN_OR_RETURN(copier_, worker::DeviceCopier::create(live_->store(), options_.copier));
  const size_t block = memory_->blockBytes();
  if (options_.bounce_blocks > 0) {
    KVF_RETURN_IF_ERROR(cudaCheck(
        cudaMallocHost(reinterpret_cast<void**>(&bounce_), options_.bounce_blocks * block),
        "cudaMallocHost bounce"));
  }
  for (uint32_t i = options_.bounce_blocks; i > 0; --i) free_bounce_.push_back(i - 1);
  KVF_RETURN_IF_ERROR(
      cudaCheck(cudaEventCreateWithFlags(&offloaded_, cudaEventDisableTiming), "cudaEventCreate"));
  return cudaCheck(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming),
                   "cudaEventCreate");
}

DeviceTiers::~DeviceTiers() {
  if (copier_ != nullptr) {
    absl::Status s = copier_->drain();
    if (!s.ok()) log::warn("device tiers: drain failed", "error", std::string(s.message()));
  }
  if (offloaded_ != nullptr) cudaEventDestroy(offloaded_);
  if (compute_mark_ != nullptr) cudaEventDestroy(compute_mark_);
  if (bounce_ != nullptr) cudaFreeHost(bounce_);
}

void DeviceTiers::offload(std::span<const worker::BlockHash> hashes,
                          std::span<const std::span<const std::byte>> payloads) {
  std::vector<worker::BlockKey> keys = keysOf(hashes);
  std::vector<const void*> sources;
  sources.reserve(payloads.size());
  for (std::span<const std::byte> p : payloads) sources.push_back(p.data());
  cudaStream_t compute = memory_->computeStream();
  auto batch = copier_->offloadAfter(keys, sources, compute);
  if (absl::IsUnavailable(batch.status())) {
    // Every batch slot holds a copy in flight: wait for them (bounded by what is queued).
    ++stats_.offload_stalls;
    absl::Status drained = copier_->drain();
    batch = drained.ok() ? copier_->offloadAfter(keys, sources, compute) : drained;
  }
  size_t taken = 0;
  if (batch.ok()) {
    taken = (*batch)->accepted();
    // The pool reuses these blocks now: its next writes wait on the device for the copy.
    absl::Status s =
        cudaCheck(cudaEventRecord(offloaded_, copier_->offloadStream()), "cudaEventRecord");
    if (s.ok()) s = cudaCheck(cudaStreamWaitEvent(compute, offloaded_, 0), "cudaStreamWaitEvent");
    if (!s.ok()) {
      // Without the device-side order the bytes must be safe before the blocks are reused.
      log::warn("device tiers: offload order", "error", std::string(s.message()));
      cudaStreamSynchronize(copier_->offloadStream());
    }
  } else {
    ++stats_.offload_copy_errors;
    log::warn("device tiers: offload copy refused", "error", std::string(batch.status().message()));
  }
  if (taken < keys.size()) offloadThroughHost(hashes.subspan(taken), payloads.subspan(taken));
}

void DeviceTiers::offloadThroughHost(std::span<const worker::BlockHash> hashes,
                                     std::span<const std::span<const std::byte>> payloads) {
  const size_t block = memory_->blockBytes();
  readback_.resize(block * hashes.size());
  std::vector<std::span<const std::byte>> host;
  host.reserve(hashes.size());
  cudaStream_t compute = memory_->computeStream();
  absl::Status s;
  for (size_t i = 0; i < payloads.size() && s.ok(); ++i) {
    std::byte* dst = readback_.data() + i * block;
    s = cudaCheck(cudaMemcpyAsync(dst, payloads[i].data(), payloads[i].size(),
                                  cudaMemcpyDeviceToHost, compute),
                  "cudaMemcpyAsync");
    host.emplace_back(dst, payloads[i].size());
  }
  if (s.ok()) s = cudaCheck(cudaStreamSynchronize(compute), "cudaStreamSynchronize");
  if (!s.ok()) {
    // The bytes cannot be read back: the blocks are lost, counted here.
    stats_.offload_lost += hashes.size();
    log::error("device tiers: read-back failed, blocks lost", "blocks", hashes.size(), "error",
               std::string(s.message()));
    return;
  }
  stats_.offload_via_host += hashes.size();
  live_->offload(hashes, host);
}

TierRun DeviceTiers::lookup(std::span<const worker::BlockHash> hashes) {
  return live_->lookup(hashes);
}

std::unique_ptr<TierOnboard> DeviceTiers::onboard(
    std::span<const worker::BlockHash> hashes, std::span<const std::span<std::byte>> destinations) {
  std::vector<worker::BlockKey> keys = keysOf(hashes);
  std::vector<void*> dst;
  dst.reserve(destinations.size());
  for (std::span<std::byte> d : destinations) dst.push_back(d.data());
  // The landing blocks may have been evicted in this step: their offload copy (which the compute
  // stream waits for) and every earlier write to them come before the onboard's copies.
  cudaStream_t compute = memory_->computeStream();
  absl::Status ordered = cudaCheck(cudaEventRecord(compute_mark_, compute), "cudaEventRecord");
  if (ordered.ok()) {
    ordered = cudaCheck(cudaStreamWaitEvent(copier_->onboardStream(), compute_mark_, 0),
                        "cudaStreamWaitEvent");
  }
  if (!ordered.ok()) {
    log::warn("device tiers: onboard order", "error", std::string(ordered.message()));
    cudaStreamSynchronize(compute);
    cudaStreamSynchronize(copier_->offloadStream());
  }
  auto head = copier_->onboard(keys, dst);
  if (!head.ok()) {
    log::warn("device tiers: onboard copy refused, the store reads instead", "error",
              std::string(head.status().message()));
  }
  auto onboard = std::make_unique<DeviceTierOnboard>(*this, head.ok() ? *head : nullptr);
  const size_t first = onboard->head_size_;
  stats_.onboard_copier_blocks += first;
  if (first == keys.size()) return onboard;
  const size_t rest = keys.size() - first;
  onboard->bounce_ = takeBounce(rest);
  const size_t n = onboard->bounce_.size();
  stats_.onboard_no_bounce += rest - n;
  stats_.onboard_bounce_blocks += n;
  if (n == 0) return onboard;
  onboard->tail_dst_.assign(dst.begin() + static_cast<std::ptrdiff_t>(first),
                            dst.begin() + static_cast<std::ptrdiff_t>(first + n));
  onboard->tail_ = live_->store().onboard(std::span(keys).subspan(first, n), onboard->bounce_);
  return onboard;
}

std::vector<worker::KvEvent> DeviceTiers::takeEvents() {
  // The offloads queued so far (this step's evictions) complete first, so their CPU stores go out
  // ahead of the step's GPU removals (putTierEventsFirst): a router resolves a token-free CPU
  // store only through the GPU entry it still holds. The wait is the copy of one step's evicted
  // blocks; offloads already done cost nothing.
  if (cudaEventQuery(offloaded_) == cudaErrorNotReady) {
    ++stats_.event_waits;
    cudaEventSynchronize(offloaded_);
  }
  copier_->poll();
  return live_->takeEvents();
}

std::vector<std::span<std::byte>> DeviceTiers::takeBounce(size_t n) {
  const size_t block = memory_->blockBytes();
  std::vector<std::span<std::byte>> slots;
  while (slots.size() < n && !free_bounce_.empty()) {
    slots.emplace_back(bounce_ + size_t{free_bounce_.back()} * block, block);
    free_bounce_.pop_back();
  }
  return slots;
}

void DeviceTiers::giveBounce(std::span<const std::span<std::byte>> slots) {
  const size_t block = memory_->blockBytes();
  for (std::span<std::byte> s : slots) {
    free_bounce_.push_back(static_cast<uint32_t>((s.data() - bounce_) / block));
  }
}

}  // namespace kvf::engine
