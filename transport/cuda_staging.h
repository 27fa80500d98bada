// Device-memory KV pools over a host-only UCX (compiled when KVF_WITH_CUDA): DeviceStagingPusher
// serves a push from device memory through a pinned host staging ring - device-to-host copies on
// its own stream with one event per chunk, the put of chunk k overlapping the copy of chunk k+1 -
// and DeviceUploader copies landed host blocks into device memory on the receiver. Each object
// owns a CUDA stream and one pipeline thread (the only thread that waits on CUDA events);
// methods are safe from any thread; callbacks run on that pipeline thread. When
// TransportContext::supportsCudaMemory() is true, register device memory directly instead.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace kvf::transport {

struct StagingOptions {
  uint64_t chunk_bytes = 4 << 20;  // one put per chunk; every block must fit in one chunk
  uint32_t chunks = 4;             // ring slots (copy/put overlap needs >= 2)
  int device = 0;
};

// True when a CUDA device is usable in this process (tests skip otherwise).
bool cudaDeviceAvailable();

class DeviceStagingPusher {
 public:
  virtual ~DeviceStagingPusher() = default;

  // Allocates the pinned ring (registered with `ctx`) and the stream; `ctx` must outlive this.
  static absl::StatusOr<std::unique_ptr<DeviceStagingPusher>> create(TransportContext& ctx,
                                                                     StagingOptions options);

  // Pushes blocks of the device pool at `device_base` (BlockCopy::local_offset is an offset in
  // it) to the peer. `request.source` and `request.blocks[*].local_offset` are replaced per
  // chunk; deadline, checksums (computed on the staged host copy) and landing_id are kept (the
  // landing notice rides on the last chunk). `done` runs once with the totals or the first error.
  virtual absl::Status push(const void* device_base, PutRequest request, PutCallback done) = 0;
};

class DeviceUploader {
 public:
  virtual ~DeviceUploader() = default;
  static absl::StatusOr<std::unique_ptr<DeviceUploader>> create(int device = 0);

  struct Copy {
    const void* host;  // e.g. inside a landing region, after the landing resolved OK
    void* device;
    uint64_t length;
  };
  // Queues host-to-device copies on the uploader's stream; `done` runs once they completed.
  virtual absl::Status upload(std::vector<Copy> copies, std::function<void(absl::Status)> done) = 0;
};

}  // namespace kvf::transport
