// Test helper: the files of a toy engine cluster for the simulator, a dense model whose step
// time is easy to compute by hand: one layer, one head of size 1, 1e9 parameters on a
// 1 TFLOP/s GPU at full efficiency, 10 ms per step, 16-token blocks. A step of n new tokens over
// ctx cached ones takes 0.010 + 2e9 n / 1e12 + 4 (n ctx + n (n + 1) / 2) / 1e12 seconds
// (compute-bound: memory time is 2e9 bytes / 1e15 B/s = 2 us); `peak_flops` scales the
// compute terms. Writes dir/profile.yaml and dir/engine.yaml (the one to name as the cluster's
// engine_config).
#pragma once

#include <filesystem>
#include <fstream>

namespace kvf::testing {

inline void writeToyCluster(const std::filesystem::path& dir, int batched_tokens = 8192,
                            double peak_flops = 1.0e12) {
  std::ofstream(dir / "profile.yaml") << R"(name: toy
kv_cache_tokens: 160000
model: {name: toy, num_layers: 1, hidden_size: 1, num_attention_heads: 1, num_kv_heads: 1,
        head_dim: 1, total_params: 1.0e9, active_params: 1.0e9, dtype_bytes: 2,
        vocab_size: 50000, max_model_len: 100000}
gpu: {name: toy, peak_flops: )" << peak_flops
                                      << R"(, hbm_bytes_per_s: 1.0e15, matmul_efficiency: 1.0,
      attention_efficiency: 1.0, bandwidth_efficiency: 1.0, step_overhead_ms: 10,
      per_seq_overhead_us: 0}
)";
  std::ofstream(dir / "engine.yaml")
      << "profile: profile.yaml\ncache: {block_size: 16}\n"
      << "scheduler: {max_num_batched_tokens: " << batched_tokens << "}\n";
}

}  // namespace kvf::testing
