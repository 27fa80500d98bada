// Shared by kvf-tier-bench's modes (tier_bench.cc: host copy and disk bandwidth; tier_loss.cc:
// the loss experiment; tier_device_bench.cc: host tier <-> GPU): aligned buffers and the summary of
// repeated measurements. Single-threaded helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "engine/engine_config.h"

namespace kvf::bench {

// Page-aligned memory, every page touched (so no first-touch faults land in a timed loop).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(uint64_t bytes);
  std::byte* data() const { return memory_.get(); }
  uint64_t size() const { return size_; }
  std::span<std::byte> slice(uint64_t offset, uint64_t bytes) const {
    return {memory_.get() + offset, bytes};
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> memory_;
  uint64_t size_;
};

// Mean of repeated measurements with its 95% confidence interval (Student's t).
struct Interval {
  double mean = 0;
  double half_width = 0;
  size_t n = 0;
};
Interval meanInterval95(const std::vector<double>& samples);
std::string formatInterval(const Interval& i, int decimals);
// The mean of a[i] / b[i] (paired measurements) with its 95% interval.
Interval ratioInterval95(const std::vector<double>& a, const std::vector<double>& b);

// --mode=device (tier_device_bench.cc): host tier <-> GPU copy bandwidth, pinned slots against
// pageable memory; the process exit code (1 without CUDA or a device).
int runDevice(uint64_t block_bytes, uint64_t total_bytes, int repeats, bool json);

// --mode=overlap (tier_overlap_bench.cc): cuBLAS GEMMs alone, with an offload, with an onboard
// through the DeviceCopier; compute slowdown and copy bandwidth under compute.
struct OverlapOptions {
  uint64_t block_bytes = 2 << 20;
  uint64_t copy_bytes = 1ull << 30;  // the ring of blocks each direction cycles through
  int gemm_size = 8192;              // m = n = k
  int gemms = 0;                     // per compute run; 0: as many as fill compute_ms
  double compute_ms = 400;
  uint32_t batch_blocks = 64;
  uint32_t blocks_per_event = 16;
  uint32_t in_flight = 4;
  int repeats = 7;
  bool json = false;
};
int runOverlap(const OverlapOptions& options);
// The DeviceCopier's gathered path against per-block copies (printed by --mode=device).
int runCopierPaths(uint64_t block_bytes, uint64_t total_bytes, int repeats);

struct LossOptions {
  std::string trace;
  std::string dir;
  uint64_t block_bytes = 0;
  uint64_t unique_blocks = 0;
  uint64_t g1_blocks = 0;
  uint64_t g2_blocks = 0;
  uint64_t disk_blocks = 0;  // 0: the window's unique blocks plus 5%
  uint32_t queue_depth = 0;
  Nanos compute_per_block = 0;    // modelled prefill time of a block no tier holds
  std::vector<std::string> arms;  // "default", "lossy"
};
// Runs the loss experiment and prints its table; the process exit code.
int runLossExperiment(const LossOptions& options);

// --mode=onboard (tier_onboard.cc): modelled TTFT of a long prefix served from G1, G2, G3 or
// recomputed, through the engine core with the live tiers.
struct OnboardOptions {
  engine::EngineConfig engine;  // profile, block size; the pool and tiers are set per case
  std::string dir;              // disk tier files (emptied per case)
  int64_t prefix_tokens = 25000;
  std::vector<int64_t> suffix_tokens;  // new tokens after the prefix, one table block each
  std::vector<engine::OnboardMode> modes = {engine::OnboardMode::kWhole};  // scheduler.onboard
};
int runOnboard(const OnboardOptions& options);

}  // namespace kvf::bench
