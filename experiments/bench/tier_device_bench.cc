// kvf-tier-bench --mode=device: copy bandwidth between the host tier's slots and GPU memory, one
// cudaMemcpyAsync per block on one stream, against the same copies from ordinary pageable memory;
// then the DeviceCopier's gathered copies against per-block ones (tier_overlap_bench.cc). With CUDA
// the host tier's slots are CUDA-pinned, so the GPU copies them by DMA; pageable memory goes
// through the driver's staging buffers. Needs a build with the CUDA toolkit (KVF_WITH_CUDA) and a
// device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "experiments/bench/tier_bench.h"

#if defined(KVF_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "experiments/bench/tier_cuda_bench.h"
#include "worker/block_payload.h"
#include "worker/tiers/tiered_store.h"
#endif

namespace kvf::bench {

#if defined(KVF_WITH_CUDA)
namespace {

namespace kw = kvf::worker;
using Clock = std::chrono::steady_clock;

// Copies block i of `host` to or from block i of `device`, all on `stream`; GB/s of the whole.
double timedCopies(const std::vector<std::byte*>& host, std::byte* device, uint64_t block,
                   cudaMemcpyKind kind, cudaStream_t stream) {
  auto t0 = Clock::now();
  for (size_t i = 0; i < host.size(); ++i) {
    std::byte* d = device + i * block;
    cudaError_t e = kind == cudaMemcpyHostToDevice
                        ? cudaMemcpyAsync(d, host[i], block, kind, stream)
                        : cudaMemcpyAsync(host[i], d, block, kind, stream);
    if (!cudaOk(e, "cudaMemcpyAsync")) return -1;
  }
  if (!cudaOk(cudaStreamSynchronize(stream), "cudaStreamSynchronize")) return -1;
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(host.size() * block) / 1e9 / s;
}

}  // namespace

int runDevice(uint64_t block, uint64_t total, int repeats, bool json) {
  int devices = 0;
  cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "kvf-tier-bench --mode=device: %s\n",
                 error != cudaSuccess ? cudaGetErrorString(error) : "no CUDA device");
    return 1;
  }
  uint64_t n = std::max<uint64_t>(1, total / block);
  kw::TieredStoreOptions o;
  o.host.block_bytes = block;
  o.host.capacity_bytes = n * ((block + 4095) / 4096 * 4096);
  o.host.pin = kw::PinMode::kPreferred;
  auto store = kw::TieredStore::create(o);
  if (!store.ok()) {
    std::fprintf(stderr, "host tier: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  kw::TieredStore& s = **store;
  AlignedBuffer pageable(n * block);
  std::vector<std::byte*> slots, plain;
  std::vector<kw::HostTier::Pin> pins;  // held for the whole run: the slots cannot move
  for (uint64_t i = 0; i < n; ++i) {
    kw::fillBlockPayload(kw::BlockHash{i}, pageable.slice(i * block, block));
    if (!s.offload(i, pageable.slice(i * block, block)).ok()) return 1;
    auto pin = s.host().pin(i);
    if (!pin) return 1;
    pins.push_back(*pin);
    slots.push_back(const_cast<std::byte*>(pin->bytes.data()));
    plain.push_back(pageable.data() + i * block);
  }
  void* device = nullptr;
  if (!cudaOk(cudaMalloc(&device, n * block), "cudaMalloc")) return 1;
  cudaStream_t stream = nullptr;
  if (!cudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
    return 1;
  }
  auto* dev = static_cast<std::byte*>(device);
  // h2d / d2h, pinned / pageable
  std::vector<double> h2d_pinned, h2d_pageable, d2h_pinned, d2h_pageable;
  for (int r = 0; r < repeats + 1; ++r) {  // the first round warms up and is not counted
    double a = timedCopies(slots, dev, block, cudaMemcpyHostToDevice, stream);
    double b = timedCopies(plain, dev, block, cudaMemcpyHostToDevice, stream);
    double c = timedCopies(slots, dev, block, cudaMemcpyDeviceToHost, stream);
    double d = timedCopies(plain, dev, block, cudaMemcpyDeviceToHost, stream);
    if (a < 0 || b < 0 || c < 0 || d < 0) return 1;
    if (r == 0) continue;
    h2d_pinned.push_back(a);
    h2d_pageable.push_back(b);
    d2h_pinned.push_back(c);
    d2h_pageable.push_back(d);
  }
  // Every block went up and came back down many times: it must still be itself.
  size_t wrong = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (!kw::verifyBlockPayload(kw::BlockHash{i}, {slots[i], block})) ++wrong;
    if (!kw::verifyBlockPayload(kw::BlockHash{i}, {plain[i], block})) ++wrong;
  }
  cudaStreamDestroy(stream);
  cudaFree(device);
  for (const auto& pin : pins) s.host().unpin(pin);

  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf(
      "host tier <-> %s: %llu blocks of %llu KiB, one cudaMemcpyAsync per block, host "
      "tier memory %s, %d repetitions\n",
      prop.name, static_cast<unsigned long long>(n), static_cast<unsigned long long>(block >> 10),
      std::string(kw::pinKindName(s.hostPinKind())).c_str(), repeats);
  std::printf(
      "| direction | host tier (pinned) GB/s | pageable GB/s | pinned / pageable |\n"
      "|---|---|---|---|\n");
  std::printf("| G2 -> G1 (host to device, onboard) | %s | %s | %s |\n",
              formatInterval(meanInterval95(h2d_pinned), 2).c_str(),
              formatInterval(meanInterval95(h2d_pageable), 2).c_str(),
              formatInterval(ratioInterval95(h2d_pinned, h2d_pageable), 2).c_str());
  std::printf("| G1 -> G2 (device to host, offload) | %s | %s | %s |\n",
              formatInterval(meanInterval95(d2h_pinned), 2).c_str(),
              formatInterval(meanInterval95(d2h_pageable), 2).c_str(),
              formatInterval(ratioInterval95(d2h_pinned, d2h_pageable), 2).c_str());
  if (json) {
    std::printf(
        "{\"mode\":\"device\",\"h2d_pinned_gbs\":%.4f,\"h2d_pageable_gbs\":%.4f,"
        "\"d2h_pinned_gbs\":%.4f,\"d2h_pageable_gbs\":%.4f,\"byte_mismatches\":%zu}\n",
        meanInterval95(h2d_pinned).mean, meanInterval95(h2d_pageable).mean,
        meanInterval95(d2h_pinned).mean, meanInterval95(d2h_pageable).mean, wrong);
  }
  if (wrong > 0) {
    std::fprintf(stderr, "%zu blocks came back wrong\n", wrong);
    return 1;
  }
  store->reset();  // its pinned memory goes back before the copier's own rig takes as much
  return runCopierPaths(block, total, repeats);
}

#else

int runDevice(uint64_t, uint64_t, int, bool) {
  std::fprintf(stderr,
               "kvf-tier-bench --mode=device: built without CUDA (the CUDA toolkit was not found "
               "at configure time; see KVF_ENABLE_CUDA)\n");
  return 1;
}

#endif

}  // namespace kvf::bench
