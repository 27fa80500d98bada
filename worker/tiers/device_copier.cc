#include "worker/tiers/device_copier.h"

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "transport/cuda_status.h"
#include "worker/tiers/tiered_store.h"

namespace kvf::worker {
namespace {

// The copier's errors name it (the conversion itself is cudaStatus's).
absl::Status cudaToStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return transport::cudaStatus(error, strCat("device copier: ", what));
}

// The driver answers a batched copy it cannot do with one of these: fall back, do not fail.
// The endpoints were checked before the call, so an invalid value means the batch's attributes
// were refused, not a bad block.
bool batchUnsupported(cudaError_t error) {
  return error == cudaErrorNotSupported || error == cudaErrorCallRequiresNewerDriver ||
         error == cudaErrorInvalidValue;
}

// A copy endpoint must be device memory (or managed): anything else would make the copy either
// fail late on the stream or silently copy host to host.
absl::Status checkDevicePointer(const void* p, size_t i, std::string_view role) {
  cudaPointerAttributes attributes{};
  cudaError_t error = cudaPointerGetAttributes(&attributes, p);
  if (error != cudaSuccess || p == nullptr ||
      (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)) {
    if (error != cudaSuccess) cudaGetLastError();  // not sticky: clear it
    return absl::InvalidArgumentError(
        strCat("device copier: block ", i, ": ", role, " is not device memory"));
  }
  return absl::OkStatus();
}

void destroyEvents(std::span<const cudaEvent_t> events) {
  for (cudaEvent_t e : events) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

}  // namespace

std::string_view copyPathName(CopyPath path) {
  return path == CopyPath::kBatched ? "cudaMemcpyBatchAsync" : "cudaMemcpyAsync per block";
}

DeviceOnboard::~DeviceOnboard() { destroyEvents(events_); }

size_t DeviceOnboard::readyPrefix() {
  while (ready_chunks_ < events_.size() && cudaEventQuery(events_[ready_chunks_]) == cudaSuccess) {
    ++ready_chunks_;
  }
  return std::min(size(), ready_chunks_ * blocks_per_event_);
}

absl::Status DeviceOnboard::waitOnStream(cudaStream_t stream, size_t blocks) const {
  if (blocks > size()) {
    return absl::OutOfRangeError(
        strCat("device copier: wait for ", blocks, " blocks of an onboard of ", size()));
  }
  if (blocks == 0) return absl::OkStatus();
  return cudaToStatus(cudaStreamWaitEvent(stream, events_[(blocks - 1) / blocks_per_event_], 0),
                      "cudaStreamWaitEvent");
}

absl::Status DeviceOnboard::synchronize() {
  if (events_.empty()) return absl::OkStatus();
  KVF_RETURN_IF_ERROR(cudaToStatus(cudaEventSynchronize(events_.back()), "cudaEventSynchronize"));
  readyPrefix();
  return absl::OkStatus();
}

DeviceOffload::~DeviceOffload() {
  if (done_ != nullptr) cudaEventDestroy(done_);
}

absl::StatusOr<std::unique_ptr<DeviceCopier>> DeviceCopier::create(TieredStore& store,
                                                                   DeviceCopierOptions options) {
  if (options.max_batches_in_flight == 0 || options.blocks_per_event == 0) {
    return absl::InvalidArgumentError(
        "device copier: max_batches_in_flight and blocks_per_event must be at least 1");
  }
  int devices = 0;
  cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        strCat("device copier: no usable CUDA device (",
               error != cudaSuccess ? cudaGetErrorString(error) : "none found", ")"));
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(
        strCat("device copier: device ", options.device, " of ", devices));
  }
  KVF_RETURN_IF_ERROR(cudaToStatus(cudaSetDevice(options.device), "cudaSetDevice"));
  // cudaMemcpyBatchAsync needs a 12.8 runtime (compile time) and driver (run time).
  bool batched = false;
#if CUDART_VERSION >= 12080
  int driver = 0;
  batched =
      options.batched_copies && cudaDriverGetVersion(&driver) == cudaSuccess && driver >= 12080;
#endif
  std::unique_ptr<DeviceCopier> copier(new DeviceCopier(store, options, batched));
  int least = 0, greatest = 0;
  KVF_RETURN_IF_ERROR(cudaToStatus(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                                   "cudaDeviceGetStreamPriorityRange"));
  // Onboard gates the next step: it goes first. Offload only has to finish before eviction.
  KVF_RETURN_IF_ERROR(cudaToStatus(
      cudaStreamCreateWithPriority(&copier->onboard_stream_, cudaStreamNonBlocking, greatest),
      "cudaStreamCreateWithPriority"));
  KVF_RETURN_IF_ERROR(cudaToStatus(
      cudaStreamCreateWithPriority(&copier->offload_stream_, cudaStreamNonBlocking, least),
      "cudaStreamCreateWithPriority"));
  return copier;
}

DeviceCopier::DeviceCopier(TieredStore& store, DeviceCopierOptions options, bool batched)
    : store_(store), options_(options), block_bytes_(store.blockBytes()), batched_(batched) {}

DeviceCopier::~DeviceCopier() {
  if (absl::Status s = drain(); !s.ok()) log::error("device copier: drain", "error", s.ToString());
  // A failed drain leaves batches: abandon their slots rather than leak pins and reservations.
  for (auto& batch : offloads_) retireOffload(*batch, absl::CancelledError("copier destroyed"));
  for (auto& batch : onboards_) {
    for (const auto& pin : batch->pins_) store_.host().unpin(pin);
    batch->retired_ = true;
  }
  if (onboard_stream_ != nullptr) cudaStreamDestroy(onboard_stream_);
  if (offload_stream_ != nullptr) cudaStreamDestroy(offload_stream_);
}

absl::StatusOr<cudaEvent_t> DeviceCopier::newEvent() {
  cudaEvent_t event = nullptr;
  KVF_RETURN_IF_ERROR(cudaToStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                   "cudaEventCreateWithFlags"));
  return event;
}

absl::Status DeviceCopier::copyRun(std::span<void* const> dst, std::span<const void* const> src,
                                   cudaStream_t stream, cudaMemcpyKind kind, CopyPath* path) {
#if CUDART_VERSION >= 12080
  if (batched_) {
    std::vector<size_t> sizes(dst.size(), block_bytes_);
    cudaMemcpyAttributes attributes{};
    // The host side is CUDA-pinned and the device side is ours: stream order is all we need.
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    cudaMemLocation host{cudaMemLocationTypeHost, 0};
    cudaMemLocation device{cudaMemLocationTypeDevice, options_.device};
    attributes.srcLocHint = kind == cudaMemcpyHostToDevice ? host : device;
    attributes.dstLocHint = kind == cudaMemcpyHostToDevice ? device : host;
    size_t attribute_index = 0;
    cudaError_t error = cudaMemcpyBatchAsync(dst.data(), src.data(), sizes.data(), dst.size(),
                                             &attributes, &attribute_index, 1, stream);
    if (error == cudaSuccess) {
      ++stats_.batched_calls;
      *path = CopyPath::kBatched;
      return absl::OkStatus();
    }
    if (!batchUnsupported(error)) return cudaToStatus(error, "cudaMemcpyBatchAsync");
    cudaGetLastError();
    batched_ = false;
    ++stats_.batch_fallbacks;
    log::warn("device copier: batched copies refused, copying block by block", "error",
              cudaGetErrorString(error));
  }
#endif
  for (size_t i = 0; i < dst.size(); ++i) {
    KVF_RETURN_IF_ERROR(cudaToStatus(cudaMemcpyAsync(dst[i], src[i], block_bytes_, kind, stream),
                                     "cudaMemcpyAsync"));
  }
  stats_.per_block_copies += dst.size();
  *path = CopyPath::kPerBlock;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DeviceOnboard>> DeviceCopier::onboard(
    std::span<const BlockKey> keys, std::span<void* const> destinations) {
  if (keys.size() != destinations.size()) {
    return absl::InvalidArgumentError("device copier: onboard: keys and destinations differ");
  }
  poll();
  if (onboards_.size() >= options_.max_batches_in_flight) {
    ++stats_.backpressure;
    return absl::UnavailableError("device copier: onboard batches at the in-flight bound");
  }
  for (size_t i = 0; i < destinations.size(); ++i) {
    KVF_RETURN_IF_ERROR(checkDevicePointer(destinations[i], i, "destination"));
  }
  std::shared_ptr<DeviceOnboard> batch(new DeviceOnboard(keys.size(), options_.blocks_per_event));
  std::vector<const void*> sources;
  for (BlockKey key : keys) {
    auto pin = store_.host().pin(key);
    if (!pin) break;  // the leading run only: the engine recomputes from the first gap
    sources.push_back(pin->bytes.data());
    batch->pins_.push_back(*pin);
  }
  absl::Status status;
  for (size_t first = 0; first < sources.size() && status.ok();
       first += options_.blocks_per_event) {
    size_t n = std::min<size_t>(options_.blocks_per_event, sources.size() - first);
    status = copyRun(destinations.subspan(first, n), std::span(sources).subspan(first, n),
                     onboard_stream_, cudaMemcpyHostToDevice, &batch->path_);
    if (!status.ok()) break;
    auto event = newEvent();
    if (!event.ok()) {
      status = event.status();
      break;
    }
    batch->events_.push_back(*event);
    status = cudaToStatus(cudaEventRecord(*event, onboard_stream_), "cudaEventRecord");
  }
  if (!status.ok()) {
    // Copies already queued still read the slots: let them finish before releasing them.
    cudaStreamSynchronize(onboard_stream_);
    for (const auto& pin : batch->pins_) store_.host().unpin(pin);
    batch->retired_ = true;
    return status;
  }
  if (batch->events_.empty()) {
    batch->retired_ = true;  // nothing was held
    return batch;
  }
  ++stats_.onboard_batches;
  stats_.onboard_blocks += batch->size();
  onboards_.push_back(batch);
  return batch;
}

absl::StatusOr<std::shared_ptr<DeviceOffload>> DeviceCopier::offloadAfter(
    std::span<const BlockKey> keys, std::span<const void* const> sources, cudaStream_t compute) {
  KVF_ASSIGN_OR_RETURN(cudaEvent_t ready, newEvent());
  absl::Status recorded = cudaToStatus(cudaEventRecord(ready, compute), "cudaEventRecord");
  absl::StatusOr<std::shared_ptr<DeviceOffload>> batch =
      recorded.ok() ? offload(keys, sources, ready) : recorded;
  cudaEventDestroy(ready);  // the stream wait, if any, was queued: the event may go
  return batch;
}

absl::StatusOr<std::shared_ptr<DeviceOffload>> DeviceCopier::offload(
    std::span<const BlockKey> keys, std::span<const void* const> sources, cudaEvent_t ready) {
  if (keys.size() != sources.size()) {
    return absl::InvalidArgumentError("device copier: offload: keys and sources differ");
  }
  poll();
  if (offloads_.size() >= options_.max_batches_in_flight) {
    ++stats_.backpressure;
    return absl::UnavailableError("device copier: offload batches at the in-flight bound");
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    KVF_RETURN_IF_ERROR(checkDevicePointer(sources[i], i, "source"));
  }
  std::shared_ptr<DeviceOffload> batch(new DeviceOffload(keys.size()));
  std::vector<void*> slots;
  std::vector<const void*> copied_sources;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto reserved = store_.beginOffload(keys[i]);
    if (absl::IsAlreadyExists(reserved.status())) {
      ++batch->accepted_;
      continue;
    }
    if (!reserved.ok()) break;  // backpressure: the rest stay with the caller
    ++batch->accepted_;
    slots.push_back(reserved->bytes.data());
    copied_sources.push_back(sources[i]);
    batch->reservations_.push_back(*reserved);
  }
  if (slots.empty()) {
    batch->durable_ = true;  // every accepted block was held already
    return batch;
  }
  absl::Status status =
      ready != nullptr
          ? cudaToStatus(cudaStreamWaitEvent(offload_stream_, ready, 0), "cudaStreamWaitEvent")
          : absl::OkStatus();
  if (status.ok()) {
    status = copyRun(slots, copied_sources, offload_stream_, cudaMemcpyDeviceToHost, &batch->path_);
  }
  if (status.ok()) {
    auto event = newEvent();
    status = event.status();
    if (event.ok()) {
      batch->done_ = *event;
      status = cudaToStatus(cudaEventRecord(*event, offload_stream_), "cudaEventRecord");
    }
  }
  if (!status.ok()) {
    // A queued copy may still write the slots: wait before handing them back.
    cudaStreamSynchronize(offload_stream_);
    retireOffload(*batch, status);
    return status;
  }
  ++stats_.offload_batches;
  stats_.offload_blocks += slots.size();
  offloads_.push_back(batch);
  return batch;
}

void DeviceCopier::retireOffload(DeviceOffload& batch, absl::Status status) {
  for (const auto& reservation : batch.reservations_) store_.endOffload(reservation, status.ok());
  batch.reservations_.clear();
  batch.status_ = std::move(status);
  batch.durable_ = batch.status_.ok();
}

size_t DeviceCopier::poll() {
  // One stream per direction: batches complete in submission order.
  while (!offloads_.empty()) {
    DeviceOffload& batch = *offloads_.front();
    cudaError_t error = cudaEventQuery(batch.done_);
    if (error == cudaErrorNotReady) break;
    retireOffload(batch, cudaToStatus(error, "offload copy"));
    offloads_.pop_front();
  }
  while (!onboards_.empty()) {
    DeviceOnboard& batch = *onboards_.front();
    cudaError_t error = cudaEventQuery(batch.events_.back());
    if (error == cudaErrorNotReady) break;
    if (error != cudaSuccess) {
      log::error("device copier: onboard copy failed", "error", cudaGetErrorString(error));
    }
    batch.readyPrefix();
    for (const auto& pin : batch.pins_) store_.host().unpin(pin);
    batch.retired_ = true;
    onboards_.pop_front();
  }
  return onboards_.size() + offloads_.size();
}

absl::Status DeviceCopier::drain() {
  absl::Status on = cudaToStatus(cudaStreamSynchronize(onboard_stream_), "cudaStreamSynchronize");
  absl::Status off = cudaToStatus(cudaStreamSynchronize(offload_stream_), "cudaStreamSynchronize");
  poll();
  return on.ok() ? off : on;
}

}  // namespace kvf::worker
