// kvf-tier-bench --mode=overlap: seed 002's claim measured on the DeviceCopier. Compute is cuBLAS
// bf16 GEMMs of a prefill step's size on a compute stream; it runs alone, then with an offload
// (G1 -> G2) running through the copier for as long as it computes, then with an onboard
// (G2 -> G1). Reports the compute slowdown and the copy bandwidth under compute against the copy
// alone. Also the copier's batched path (cudaMemcpyBatchAsync) against one cudaMemcpyAsync per
// block, for --mode=device. Needs CUDA (KVF_WITH_CUDA) and a device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "experiments/bench/tier_bench.h"

#if defined(KVF_WITH_CUDA)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "experiments/bench/tier_cuda_bench.h"
#include "worker/block_payload.h"
#include "worker/tiers/device_copier.h"
#include "worker/tiers/tiered_store.h"
#endif

namespace kvf::bench {

#if defined(KVF_WITH_CUDA)
namespace {

namespace kw = kvf::worker;
using Clock = std::chrono::steady_clock;

constexpr kw::BlockKey kOffloadKeys = 1ull << 40;  // offloaded blocks' keys, apart from onboard's

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// n blocks resident in the host tier (keys 0..n-1, onboard's source) and n blocks of device
// memory; offload copies device block i to key kOffloadKeys + i, removed again a lap later.
struct Rig {
  uint64_t block = 0;
  size_t n = 0;
  std::unique_ptr<kw::TieredStore> store;
  std::byte* device = nullptr;
  cudaEvent_t step_done = nullptr;  // the "step that wrote the blocks" on the compute stream

  ~Rig() {
    if (step_done != nullptr) cudaEventDestroy(step_done);
    if (device != nullptr) cudaFree(device);
  }
};

bool makeRig(Rig& rig, uint64_t block, uint64_t total) {
  int devices = 0;
  cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "kvf-tier-bench: %s\n",
                 error != cudaSuccess ? cudaGetErrorString(error) : "no CUDA device");
    return false;
  }
  rig.block = block;
  rig.n = std::max<uint64_t>(1, total / block);
  kw::TieredStoreOptions o;
  o.host.block_bytes = block;
  o.host.capacity_bytes = 2 * rig.n * ((block + 4095) / 4096 * 4096);
  o.host.pin = kw::PinMode::kRequired;
  auto store = kw::TieredStore::create(o);
  if (!store.ok()) {
    std::fprintf(stderr, "host tier: %s\n", std::string(store.status().message()).c_str());
    return false;
  }
  rig.store = std::move(*store);
  std::vector<std::byte> payload(block);
  for (size_t i = 0; i < rig.n; ++i) {
    kw::fillBlockPayload(kw::BlockHash{i}, payload);
    if (!rig.store->offload(i, payload).ok()) return false;
  }
  void* device = nullptr;
  if (!cudaOk(cudaMalloc(&device, rig.n * block), "cudaMalloc")) return false;
  rig.device = static_cast<std::byte*>(device);
  return cudaOk(cudaEventCreateWithFlags(&rig.step_done, cudaEventDisableTiming),
                "cudaEventCreate");
}

// A ring block is used again only once its last batch has retired: the ring must hold more
// batches than may be in flight.
bool ringFits(const Rig& rig, size_t batch, size_t in_flight) {
  if (rig.n >= (in_flight + 1) * batch) return true;
  std::fprintf(stderr, "--host_mib must hold at least %zu blocks (%zu batches of %zu)\n",
               (in_flight + 1) * batch, in_flight + 1, batch);
  return false;
}

enum class Direction { kOffload, kOnboard };

struct PumpResult {
  uint64_t bytes = 0;  // completed when stop() first held (or all, without stop)
  double seconds = 0;
  bool ok = false;
};

// Keeps the copier's stream busy with batches of `batch` blocks in a ring over the rig's blocks
// until stop() holds (or `max_blocks` were submitted), counting bytes as batches complete.
PumpResult pump(Rig& rig, kw::DeviceCopier& copier, Direction direction, size_t batch,
                const std::function<bool()>& stop, uint64_t max_blocks) {
  struct InFlight {
    std::shared_ptr<kw::DeviceOnboard> on;
    std::shared_ptr<kw::DeviceOffload> off;
    uint64_t bytes = 0;
  };
  std::deque<InFlight> flying;
  PumpResult result;
  size_t next = 0;
  uint64_t submitted = 0;
  auto t0 = Clock::now();
  auto reap = [&] {
    copier.poll();
    while (!flying.empty() &&
           (flying.front().on ? flying.front().on->done() : flying.front().off->durable())) {
      result.bytes += flying.front().bytes;
      flying.pop_front();
    }
  };
  while (submitted < max_blocks && !(stop && stop())) {
    size_t first = next, count = std::min(batch, rig.n - next);
    std::vector<kw::BlockKey> keys;
    std::vector<void*> blocks;
    for (size_t i = first; i < first + count; ++i) {
      blocks.push_back(rig.device + i * rig.block);
      keys.push_back(direction == Direction::kOnboard ? i : kOffloadKeys + i);
      if (direction == Direction::kOffload) rig.store->remove(keys.back());  // a lap ago: durable
    }
    InFlight f;
    absl::Status status;
    if (direction == Direction::kOnboard) {
      auto on = copier.onboard(keys, blocks);
      status = on.status();
      if (on.ok()) f = {*on, nullptr, (*on)->size() * rig.block};
    } else {
      std::vector<const void*> sources(blocks.begin(), blocks.end());
      auto off = copier.offload(keys, sources, rig.step_done);
      status = off.status();
      if (off.ok()) f = {nullptr, *off, (*off)->copied() * rig.block};
    }
    if (absl::IsUnavailable(status)) {  // at the in-flight bound: wait for the oldest
      reap();
      std::this_thread::yield();
      continue;
    }
    if (!status.ok()) {
      std::fprintf(stderr, "copier: %s\n", status.ToString().c_str());
      return result;
    }
    flying.push_back(f);
    submitted += count;
    next = (next + count) % rig.n;
    reap();
  }
  if (stop) {
    reap();
    result.seconds = secondsSince(t0);
    uint64_t counted = result.bytes;
    if (!copier.drain().ok()) return result;
    reap();
    result.bytes = counted;
  } else {
    if (!copier.drain().ok()) return result;
    reap();
    result.seconds = secondsSince(t0);
  }
  result.ok = flying.empty();
  return result;
}

// A prefill step's worth of bf16 GEMMs on `stream`.
struct Gemms {
  cublasHandle_t handle = nullptr;
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  int n = 0;

  ~Gemms() {
    if (handle != nullptr) cublasDestroy(handle);
    for (void* p : {a, b, c}) {
      if (p != nullptr) cudaFree(p);
    }
  }
  bool init(int size, cudaStream_t stream) {
    n = size;
    size_t bytes = static_cast<size_t>(n) * n * sizeof(__nv_bfloat16);
    for (void** p : {&a, &b, &c}) {
      if (!cudaOk(cudaMalloc(p, bytes), "cudaMalloc")) return false;
      // 0x3c3c is bf16 0.0115: finite products, no denormals.
      if (!cudaOk(cudaMemset(*p, 0x3c, bytes), "cudaMemset")) return false;
    }
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasCreate failed\n");
      return false;
    }
    return cublasSetStream(handle, stream) == CUBLAS_STATUS_SUCCESS;
  }
  bool launch(int count) {
    const float alpha = 1.0f, beta = 0.0f;
    for (int i = 0; i < count; ++i) {
      cublasStatus_t s = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a,
                                      CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (s != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasGemmEx: status %d\n", static_cast<int>(s));
        return false;
      }
    }
    return true;
  }
};

// Milliseconds the compute stream spent on `count` GEMMs, while `during` runs on this thread
// (given a function telling it whether the GEMMs are done). -1 on failure.
double timedCompute(Gemms& gemms, cudaStream_t stream, int count,
                    const std::function<void(const std::function<bool()>&)>& during) {
  cudaEvent_t start = nullptr, end = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&end);
  double ms = -1;
  if (cudaOk(cudaEventRecord(start, stream), "cudaEventRecord") && gemms.launch(count) &&
      cudaOk(cudaEventRecord(end, stream), "cudaEventRecord")) {
    if (during) during([&] { return cudaEventQuery(end) != cudaErrorNotReady; });
    float elapsed = 0;
    if (cudaOk(cudaEventSynchronize(end), "cudaEventSynchronize") &&
        cudaOk(cudaEventElapsedTime(&elapsed, start, end), "cudaEventElapsedTime")) {
      ms = elapsed;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return ms;
}

// Every device block i must hold key i's payload after the onboards.
size_t wrongBlocks(const Rig& rig) {
  std::vector<std::byte> out(rig.block);
  size_t wrong = 0;
  for (size_t i = 0; i < rig.n; ++i) {
    if (!cudaOk(
            cudaMemcpy(out.data(), rig.device + i * rig.block, rig.block, cudaMemcpyDeviceToHost),
            "cudaMemcpy") ||
        !kw::verifyBlockPayload(kw::BlockHash{i}, out)) {
      ++wrong;
    }
  }
  return wrong;
}

std::string gbs(const std::vector<double>& v) { return formatInterval(meanInterval95(v), 1); }

}  // namespace

int runOverlap(const OverlapOptions& options) {
  Rig rig;
  if (!makeRig(rig, options.block_bytes, options.copy_bytes)) return 1;
  if (!ringFits(rig, options.batch_blocks, options.in_flight)) return 1;
  kw::DeviceCopierOptions co;
  co.blocks_per_event = options.blocks_per_event;
  co.max_batches_in_flight = options.in_flight;
  auto copier = kw::DeviceCopier::create(*rig.store, co);
  if (!copier.ok()) {
    std::fprintf(stderr, "%s\n", copier.status().ToString().c_str());
    return 1;
  }
  cudaStream_t compute = nullptr;
  if (!cudaOk(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreate")) {
    return 1;
  }
  Gemms gemms;
  if (!gemms.init(options.gemm_size, compute)) return 1;
  // The step whose blocks are offloaded: one GEMM, then the offload may start.
  if (!gemms.launch(1) || !cudaOk(cudaEventRecord(rig.step_done, compute), "cudaEventRecord") ||
      !cudaOk(cudaStreamSynchronize(compute), "cudaStreamSynchronize")) {
    return 1;
  }
  double one = timedCompute(gemms, compute, 10, {}) / 10;  // also warms cuBLAS up
  int count =
      options.gemms > 0 ? options.gemms : std::max(10, static_cast<int>(options.compute_ms / one));
  double flop = 2.0 * options.gemm_size * options.gemm_size * options.gemm_size * count;

  std::vector<double> alone_ms, off_ms, on_ms, off_gbs, on_gbs, off_alone_gbs, on_alone_gbs;
  const uint64_t unlimited = ~0ull;
  for (int r = 0; r < options.repeats + 1; ++r) {  // round 0 warms up
    double a = timedCompute(gemms, compute, count, {});
    PumpResult off_under{}, on_under{};
    double b = timedCompute(gemms, compute, count, [&](const std::function<bool()>& done) {
      off_under = pump(rig, **copier, Direction::kOffload, options.batch_blocks, done, unlimited);
    });
    double c = timedCompute(gemms, compute, count, [&](const std::function<bool()>& done) {
      on_under = pump(rig, **copier, Direction::kOnboard, options.batch_blocks, done, unlimited);
    });
    PumpResult off_alone =
        pump(rig, **copier, Direction::kOffload, options.batch_blocks, {}, rig.n);
    PumpResult on_alone = pump(rig, **copier, Direction::kOnboard, options.batch_blocks, {}, rig.n);
    if (a < 0 || b < 0 || c < 0 || !off_under.ok || !on_under.ok || !off_alone.ok || !on_alone.ok) {
      return 1;
    }
    if (r == 0) continue;
    alone_ms.push_back(a);
    off_ms.push_back(b);
    on_ms.push_back(c);
    off_gbs.push_back(off_under.bytes / 1e9 / off_under.seconds);
    on_gbs.push_back(on_under.bytes / 1e9 / on_under.seconds);
    off_alone_gbs.push_back(off_alone.bytes / 1e9 / off_alone.seconds);
    on_alone_gbs.push_back(on_alone.bytes / 1e9 / on_alone.seconds);
  }
  size_t wrong = wrongBlocks(rig);
  const kw::DeviceCopierStats& st = (*copier)->stats();

  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf(
      "%s: compute = %d bf16 GEMMs %dx%dx%d on a compute stream (%.0f TFLOP/s alone); copies "
      "through the DeviceCopier, %zu blocks of %llu KiB (%.2f GiB), %u blocks a batch, %u "
      "batches in flight, path %s (%llu batched calls, %llu per-block copies, %llu "
      "fallbacks), %d repetitions\n",
      prop.name, count, options.gemm_size, options.gemm_size, options.gemm_size,
      flop / (meanInterval95(alone_ms).mean / 1e3) / 1e12, rig.n,
      static_cast<unsigned long long>(rig.block >> 10),
      static_cast<double>(rig.n * rig.block) / (1ull << 30), options.batch_blocks,
      options.in_flight, std::string(kw::copyPathName((*copier)->path())).c_str(),
      static_cast<unsigned long long>(st.batched_calls),
      static_cast<unsigned long long>(st.per_block_copies),
      static_cast<unsigned long long>(st.batch_fallbacks), options.repeats);
  std::printf(
      "| run | compute ms | compute slowdown | copy GB/s under compute | copy GB/s alone |\n"
      "|---|---|---|---|---|\n");
  std::printf("| compute alone | %s | 1 | | |\n",
              formatInterval(meanInterval95(alone_ms), 1).c_str());
  std::printf("| + offload G1 -> G2 | %s | %s | %s | %s |\n",
              formatInterval(meanInterval95(off_ms), 1).c_str(),
              formatInterval(ratioInterval95(off_ms, alone_ms), 3).c_str(), gbs(off_gbs).c_str(),
              gbs(off_alone_gbs).c_str());
  std::printf("| + onboard G2 -> G1 | %s | %s | %s | %s |\n",
              formatInterval(meanInterval95(on_ms), 1).c_str(),
              formatInterval(ratioInterval95(on_ms, alone_ms), 3).c_str(), gbs(on_gbs).c_str(),
              gbs(on_alone_gbs).c_str());
  if (options.json) {
    std::printf(
        "{\"mode\":\"overlap\",\"compute_ms\":%.3f,\"offload_slowdown\":%.4f,"
        "\"onboard_slowdown\":%.4f,\"offload_gbs\":%.3f,\"onboard_gbs\":%.3f,"
        "\"offload_alone_gbs\":%.3f,\"onboard_alone_gbs\":%.3f,\"byte_mismatches\":%zu}\n",
        meanInterval95(alone_ms).mean, ratioInterval95(off_ms, alone_ms).mean,
        ratioInterval95(on_ms, alone_ms).mean, meanInterval95(off_gbs).mean,
        meanInterval95(on_gbs).mean, meanInterval95(off_alone_gbs).mean,
        meanInterval95(on_alone_gbs).mean, wrong);
  }
  copier->reset();
  cudaStreamDestroy(compute);
  if (wrong > 0) {
    std::fprintf(stderr, "%zu onboarded blocks came back wrong\n", wrong);
    return 1;
  }
  return 0;
}

int runCopierPaths(uint64_t block, uint64_t total, int repeats) {
  Rig rig;
  if (!makeRig(rig, block, total)) return 1;
  constexpr size_t kBatch = 64;
  kw::DeviceCopierOptions defaults;
  if (!ringFits(rig, kBatch, defaults.max_batches_in_flight)) return 1;
  // Both directions, each path: GB/s of whole-ring passes.
  std::vector<double> gbs_by[2][2];  // [batched?][onboard?]
  bool batched_ran = false;
  for (int batched = 1; batched >= 0; --batched) {
    kw::DeviceCopierOptions co;
    co.batched_copies = batched == 1;
    co.blocks_per_event = 16;
    auto copier = kw::DeviceCopier::create(*rig.store, co);
    if (!copier.ok()) {
      std::fprintf(stderr, "%s\n", copier.status().ToString().c_str());
      return 1;
    }
    if (!cudaOk(cudaEventRecord(rig.step_done, (*copier)->offloadStream()), "cudaEventRecord")) {
      return 1;
    }
    for (int r = 0; r < repeats + 1; ++r) {
      PumpResult on = pump(rig, **copier, Direction::kOnboard, kBatch, {}, rig.n);
      PumpResult off = pump(rig, **copier, Direction::kOffload, kBatch, {}, rig.n);
      if (!on.ok || !off.ok) return 1;
      if (r == 0) continue;
      gbs_by[batched][1].push_back(on.bytes / 1e9 / on.seconds);
      gbs_by[batched][0].push_back(off.bytes / 1e9 / off.seconds);
    }
    if (batched == 1) batched_ran = (*copier)->stats().batched_calls > 0;
  }
  size_t wrong = wrongBlocks(rig);
  std::printf(
      "\nDeviceCopier, %zu blocks of %llu KiB, %zu blocks a batch: gathered "
      "(cudaMemcpyBatchAsync%s) against one cudaMemcpyAsync per block\n",
      rig.n, static_cast<unsigned long long>(block >> 10), kBatch,
      batched_ran ? "" : ": REFUSED by the driver, per-block copies ran");
  std::printf(
      "| direction | batched GB/s | per-block GB/s | batched / per-block |\n"
      "|---|---|---|---|\n");
  const char* names[2] = {"G1 -> G2 (offload)", "G2 -> G1 (onboard)"};
  for (int onboard = 1; onboard >= 0; --onboard) {
    std::printf("| %s | %s | %s | %s |\n", names[onboard], gbs(gbs_by[1][onboard]).c_str(),
                gbs(gbs_by[0][onboard]).c_str(),
                formatInterval(ratioInterval95(gbs_by[1][onboard], gbs_by[0][onboard]), 3).c_str());
  }
  if (wrong > 0) {
    std::fprintf(stderr, "%zu onboarded blocks came back wrong\n", wrong);
    return 1;
  }
  return 0;
}

#else

int runOverlap(const OverlapOptions&) {
  std::fprintf(stderr,
               "kvf-tier-bench --mode=overlap: built without CUDA (the CUDA toolkit was not found "
               "at configure time; see KVF_ENABLE_CUDA)\n");
  return 1;
}

int runCopierPaths(uint64_t, uint64_t, int) { return 1; }

#endif

}  // namespace kvf::bench
