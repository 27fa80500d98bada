// Performance model of one GPU running one model: how long an engine step takes for a batch of
// (new tokens, context) entries, from model shape and GPU figures (roofline: max of compute
// and memory time, plus fixed per-step and per-sequence overheads). Profiles are YAML files in
// engine/profiles/. Pure functions of the profile; immutable after load, safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/config.h"

namespace kvf::engine {

struct ModelShape {
  std::string name;
  int num_layers = 0;
  int hidden_size = 0;
  int num_attention_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  double total_params = 0;   // all weights
  double active_params = 0;  // weights used per token (== total for dense models)
  int num_experts = 0;       // 0 for dense models
  int experts_per_token = 0;
  int dtype_bytes = 2;
  int64_t vocab_size = 0;
  int64_t eos_token_id = -1;  // -1: vocab_size - 1
  int64_t max_model_len = 0;
};

struct GpuFigures {
  std::string name;
  double peak_flops = 0;              // dense FLOP/s at the model's dtype
  double hbm_bytes_per_s = 0;         // memory bandwidth
  double matmul_efficiency = 0.5;     // achieved fraction of peak on the linear layers
  double attention_efficiency = 0.5;  // achieved fraction of peak on attention
  double bandwidth_efficiency = 0.8;  // achieved fraction of HBM bandwidth
  double step_overhead_s = 0;         // fixed cost per step (scheduling, launches, sampling)
  double per_seq_overhead_s = 0;      // extra cost per sequence in the batch
};

// Figures the profile claims; tests check the model reproduces them.
struct Anchors {
  double prefill_tokens_per_s = 0;  // cold prefill of prefill_prompt_tokens, chunked
  int64_t prefill_prompt_tokens = 0;
  int64_t prefill_chunk_tokens = 8192;
  double tpot_s = 0;  // decode step with tpot_batch sequences of tpot_context_tokens each
  int tpot_batch = 1;
  int64_t tpot_context_tokens = 0;
};

// The link KV pushes between instances cross (RDMA NIC), as the timing model sees it.
struct LinkFigures {
  double bandwidth_gbps = 200;  // gigabits per second
  double overhead_us = 50;      // fixed cost per transfer (setup, flush, completion)
};

// G1 <-> G2 copies (host memory over PCIe) and G3 reads and writes (local NVMe), as the timing
// model charges KV tiers: an onboard costs the blocks' logical KV bytes over PCIe, with disk
// blocks also read from disk (the two pipelined: the slower sets the pace).
struct PcieFigures {
  double bandwidth_gbps = 400;  // gigabits per second, one direction (PCIe 5.0 x16 effective)
  double overhead_us = 10;      // fixed cost per onboard (submission, completion event)
};
struct DiskFigures {
  double read_gbps = 48;  // gigabits per second
  double write_gbps = 32;
};

// How an onboard from the lower tiers meets the prefill step that needs it (engine config
// `scheduler.onboard`, docs/engine.md "Onboarding: whole or layer-wise").
enum class OnboardMode {
  // The request's whole onboard finishes before its first step (vLLM's OffloadingConnector: the
  // request waits in WAITING_FOR_REMOTE_KVS and wait_for_layer_load() does nothing).
  kWhole,
  // The KV lands layer by layer (LMCache's layer-wise mode): the step starts once the first
  // layer's share is in, and layer l's compute waits only for layer l's KV.
  kLayerwise,
};

struct Profile {
  std::string name;
  ModelShape model;
  GpuFigures gpu;
  int64_t kv_cache_tokens = 0;  // KV capacity of the GPU for this model
  Anchors anchors;
  LinkFigures link;  // YAML `link: {bandwidth_gbps, overhead_us}`; defaults if absent
  PcieFigures pcie;  // YAML `pcie: {bandwidth_gbps, overhead_us}`; defaults if absent
  DiskFigures disk;  // YAML `disk: {read_gbps, write_gbps}`; defaults if absent
};

// Parses a profile mapping (used by loadProfile and by inline profiles in engine configs).
void parseProfile(config::ConfigMap& root, Profile* out);
absl::StatusOr<Profile> loadProfile(const std::string& path);

// One sequence's share of a step.
struct BatchEntry {
  int64_t new_tokens = 0;      // tokens computed this step (1 for a decode)
  int64_t context_tokens = 0;  // tokens already in the KV cache before this step
};

class TimingModel {
 public:
  explicit TimingModel(Profile profile);

  const Profile& profile() const { return profile_; }
  // Logical KV bytes per token (K and V, every layer), as the real model stores them.
  double kvBytesPerToken() const { return kv_bytes_per_token_; }

  // Seconds one step takes for this batch; 0 for an empty batch.
  double stepSeconds(std::span<const BatchEntry> batch) const;
  Nanos stepDuration(std::span<const BatchEntry> batch) const;

  // Cold prefill throughput of one prompt processed alone in chunks (tokens/s).
  double prefillTokensPerSecond(int64_t prompt_tokens, int64_t chunk_tokens) const;
  // One decode step with `batch` sequences of `context_tokens` each.
  double decodeStepSeconds(int batch, int64_t context_tokens) const;

  // Modelled time to push `tokens` tokens of KV over the profile's link: logical KV bytes /
  // bandwidth + per-transfer overhead; 0 for tokens <= 0.
  double transferSeconds(int64_t tokens) const;
  Nanos transferDuration(int64_t tokens) const;

  // Modelled time to onboard KV into the pool: `host_tokens` from host memory and `disk_tokens`
  // from disk: the fixed overhead plus the bytes' transfer (PCIe, with disk reads pipelined;
  // the slower sets the pace); 0 when both are 0.
  double onboardSeconds(int64_t host_tokens, int64_t disk_tokens) const;
  Nanos onboardDuration(int64_t host_tokens, int64_t disk_tokens) const;
  // Modelled time to read `tokens` of KV from disk into host memory (a promotion: the disk's
  // read bandwidth alone, no PCIe leg and no per-onboard overhead).
  Nanos diskReadDuration(int64_t tokens) const;
  // How long after its start an onboard lets the request's step begin: the whole onboard
  // (kWhole: swap-in finishes before the step that needs it, seeds/002_*), or the overhead plus
  // the first layer's share of the transfer (kLayerwise); 0 when both token counts are 0.
  double onboardReadySeconds(OnboardMode mode, int64_t host_tokens, int64_t disk_tokens) const;
  Nanos onboardReadyDuration(OnboardMode mode, int64_t host_tokens, int64_t disk_tokens) const;

  // Layers the KV arrives in, layer by layer (the model's num_layers, at least 1).
  int layers() const { return layers_; }
  // A step of `compute` that starts at `start` while the KV it needs arrives layer by layer,
  // evenly, and is complete at `kv_ready_at`: layer l's compute (compute / layers, the whole
  // batch's) waits for layer l's KV, so the step ends at max(start + compute, kv_ready_at +
  // compute / layers). Its duration from `start`; `compute` when kv_ready_at <= start.
  Nanos layeredStepDuration(Nanos compute, Nanos start, Nanos kv_ready_at) const;
  // From an onboard's start to the end of the first step that uses it, when that step (of
  // `compute_s` alone) starts as soon as the mode allows. kWhole: O + C. kLayerwise, with
  // transfer L = O - overhead, per-layer Lk = L / layers and Ck = C / layers: overhead +
  // Lk + Ck + (layers - 1) * max(Lk, Ck) = overhead + max(C, L) + min(Ck, Lk).
  double onboardedStepSeconds(OnboardMode mode, int64_t host_tokens, int64_t disk_tokens,
                              double compute_s) const;

 private:
  Profile profile_;
  double kv_bytes_per_token_ = 0;
  int layers_ = 1;
  double dense_params_ = 0;   // weights every token reads
  double expert_params_ = 0;  // routed-expert weights (all experts)
  // MoE: pow(1 - experts_per_token / num_experts, k) for step token counts k below its size
  // (a simulator asks for millions of steps; the values are pow's own).
  std::vector<double> expert_miss_pow_;
};

}  // namespace kvf::engine
