#include "engine/timing_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvf::engine {

void parseProfile(config::ConfigMap& root, Profile* out) {
  root.get("name", &out->name);
  root.require("name");
  root.require("model");
  root.require("gpu");
  root.require("kv_cache_tokens");
  root.get("kv_cache_tokens", &out->kv_cache_tokens, 1, int64_t{1} << 40);
  if (auto m = root.map("model")) {
    ModelShape& s = out->model;
    m->get("name", &s.name);
    for (const char* key :
         {"num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
          "total_params", "active_params", "vocab_size", "max_model_len"}) {
      m->require(key);
    }
    m->get("num_layers", &s.num_layers, 1, 4096);
    m->get("hidden_size", &s.hidden_size, 1, 1 << 20);
    m->get("num_attention_heads", &s.num_attention_heads, 1, 4096);
    m->get("num_kv_heads", &s.num_kv_heads, 1, 4096);
    m->get("head_dim", &s.head_dim, 1, 4096);
    m->get("total_params", &s.total_params, 1e6, 1e14);
    m->get("active_params", &s.active_params, 1e6, 1e14);
    m->get("num_experts", &s.num_experts, 0, 1 << 16);
    m->get("experts_per_token", &s.experts_per_token, 0, 1 << 16);
    m->get("dtype_bytes", &s.dtype_bytes, 1, 8);
    m->get("vocab_size", &s.vocab_size, 16, int64_t{1} << 24);
    m->get("max_model_len", &s.max_model_len, 16, int64_t{1} << 24);
    m->get("eos_token_id", &s.eos_token_id, -1, int64_t{1} << 24);
    if (s.active_params > s.total_params) m->fail("active_params", "must be <= total_params");
    if (s.num_experts > 0 && (s.experts_per_token < 1 || s.experts_per_token > s.num_experts)) {
      m->fail("experts_per_token", "must be in [1, num_experts] for an MoE model");
    }
    m->rejectUnknownKeys();
  }
  if (auto g = root.map("gpu")) {
    GpuFigures& f = out->gpu;
    g->require("peak_flops");
    g->require("hbm_bytes_per_s");
    g->get("name", &f.name);
    g->get("peak_flops", &f.peak_flops, 1e9, 1e18);
    g->get("hbm_bytes_per_s", &f.hbm_bytes_per_s, 1e9, 1e15);
    g->get("matmul_efficiency", &f.matmul_efficiency, 0.01, 1.0);
    g->get("attention_efficiency", &f.attention_efficiency, 0.01, 1.0);
    g->get("bandwidth_efficiency", &f.bandwidth_efficiency, 0.01, 1.0);
    double step_ms = f.step_overhead_s * 1e3, seq_us = f.per_seq_overhead_s * 1e6;
    g->get("step_overhead_ms", &step_ms, 0.0, 10'000.0);
    g->get("per_seq_overhead_us", &seq_us, 0.0, 1e6);
    f.step_overhead_s = step_ms * 1e-3;
    f.per_seq_overhead_s = seq_us * 1e-6;
    g->rejectUnknownKeys();
  }
  if (auto a = root.map("anchors")) {
    Anchors& x = out->anchors;
    double tpot_ms = x.tpot_s * 1e3;
    a->get("prefill_tokens_per_s", &x.prefill_tokens_per_s, 0.0, 1e9);
    a->get("prefill_prompt_tokens", &x.prefill_prompt_tokens, 1, int64_t{1} << 24);
    a->get("prefill_chunk_tokens", &x.prefill_chunk_tokens, 1, int64_t{1} << 24);
    a->get("tpot_ms", &tpot_ms, 0.0, 1e6);
    a->get("tpot_batch", &x.tpot_batch, 1, 1 << 16);
    a->get("tpot_context_tokens", &x.tpot_context_tokens, 0, int64_t{1} << 24);
    x.tpot_s = tpot_ms * 1e-3;
    a->rejectUnknownKeys();
  }
  if (auto l = root.map("link")) {
    l->get("bandwidth_gbps", &out->link.bandwidth_gbps, 0.001, 1e6);
    l->get("overhead_us", &out->link.overhead_us, 0.0, 1e7);
    l->rejectUnknownKeys();
  }
  if (auto p = root.map("pcie")) {
    p->get("bandwidth_gbps", &out->pcie.bandwidth_gbps, 0.001, 1e6);
    p->get("overhead_us", &out->pcie.overhead_us, 0.0, 1e7);
    p->rejectUnknownKeys();
  }
  if (auto d = root.map("disk")) {
    d->get("read_gbps", &out->disk.read_gbps, 0.001, 1e6);
    d->get("write_gbps", &out->disk.write_gbps, 0.001, 1e6);
    d->rejectUnknownKeys();
  }
}

absl::StatusOr<Profile> loadProfile(const std::string& path) {
  return config::parseFile<Profile>(path, parseProfile);
}

TimingModel::TimingModel(Profile profile) : profile_(std::move(profile)) {
  const ModelShape& m = profile_.model;
  kv_bytes_per_token_ = 2.0 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes;
  layers_ = std::max(1, m.num_layers);
  if (m.num_experts > 0 && m.experts_per_token < m.num_experts) {
    // active = dense + expert * k/E and total = dense + expert.
    double share = static_cast<double>(m.experts_per_token) / m.num_experts;
    expert_params_ = (m.total_params - m.active_params) / (1.0 - share);
    dense_params_ = m.total_params - expert_params_;
    constexpr size_t kPowTable = 8193;  // the default max_num_batched_tokens, inclusive
    expert_miss_pow_.resize(kPowTable);
    for (size_t k = 0; k < kPowTable; ++k) {
      expert_miss_pow_[k] = std::pow(1.0 - share, static_cast<double>(k));
    }
  } else {
    dense_params_ = m.total_params;
  }
}

double TimingModel::stepSeconds(std::span<const BatchEntry> batch) const {
  if (batch.empty()) return 0;
  const ModelShape& m = profile_.model;
  const GpuFigures& g = profile_.gpu;
  double tokens = 0, attn_flops = 0, kv_bytes = 0;
  // Per query token and per key position: QK^T and AV, 2 FLOPs per multiply-add, every layer.
  double attn_per_pair = 4.0 * m.num_layers * m.num_attention_heads * m.head_dim;
  for (const BatchEntry& e : batch) {
    auto n = static_cast<double>(e.new_tokens);
    auto ctx = static_cast<double>(e.context_tokens);
    tokens += n;
    attn_flops += attn_per_pair * (n * ctx + n * (n + 1) / 2);
    kv_bytes += kv_bytes_per_token_ * (ctx + n);  // read the context, write the new tokens
  }
  double linear_flops = 2.0 * m.active_params * tokens;
  double compute_s = linear_flops / (g.peak_flops * g.matmul_efficiency) +
                     attn_flops / (g.peak_flops * g.attention_efficiency);
  double weights = dense_params_;
  if (expert_params_ > 0) {
    // Fraction of experts at least one token of the step routes to (uniform routing).
    double share = static_cast<double>(m.experts_per_token) / m.num_experts;
    // tokens is a sum of integers: exact, so the table holds the very value pow returns.
    double miss = tokens < static_cast<double>(expert_miss_pow_.size())
                      ? expert_miss_pow_[static_cast<size_t>(tokens)]
                      : std::pow(1.0 - share, tokens);
    weights += expert_params_ * (1.0 - miss);
  }
  double memory_s =
      (weights * m.dtype_bytes + kv_bytes) / (g.hbm_bytes_per_s * g.bandwidth_efficiency);
  return g.step_overhead_s + g.per_seq_overhead_s * static_cast<double>(batch.size()) +
         std::max(compute_s, memory_s);
}

Nanos TimingModel::stepDuration(std::span<const BatchEntry> batch) const {
  return secondsToNanosRounded(stepSeconds(batch));
}

double TimingModel::prefillTokensPerSecond(int64_t prompt_tokens, int64_t chunk_tokens) const {
  double total = 0;
  for (int64_t done = 0; done < prompt_tokens;) {
    int64_t n = std::min(chunk_tokens, prompt_tokens - done);
    BatchEntry e{n, done};
    total += stepSeconds(std::span<const BatchEntry>(&e, 1));
    done += n;
  }
  return total > 0 ? static_cast<double>(prompt_tokens) / total : 0;
}

double TimingModel::decodeStepSeconds(int batch, int64_t context_tokens) const {
  std::vector<BatchEntry> entries(static_cast<size_t>(batch), BatchEntry{1, context_tokens});
  return stepSeconds(entries);
}

double TimingModel::transferSeconds(int64_t tokens) const {
  if (tokens <= 0) return 0;
  double bytes = kv_bytes_per_token_ * static_cast<double>(tokens);
  return bytes * 8.0 / (profile_.link.bandwidth_gbps * 1e9) + profile_.link.overhead_us * 1e-6;
}

Nanos TimingModel::transferDuration(int64_t tokens) const {
  return secondsToNanosRounded(transferSeconds(tokens));
}

double TimingModel::onboardSeconds(int64_t host_tokens, int64_t disk_tokens) const {
  host_tokens = std::max<int64_t>(0, host_tokens);
  disk_tokens = std::max<int64_t>(0, disk_tokens);
  if (host_tokens + disk_tokens == 0) return 0;
  const double bits_per_token = kv_bytes_per_token_ * 8.0;
  double pcie = bits_per_token * static_cast<double>(host_tokens + disk_tokens) /
                (profile_.pcie.bandwidth_gbps * 1e9);
  double disk = bits_per_token * static_cast<double>(disk_tokens) / (profile_.disk.read_gbps * 1e9);
  return std::max(pcie, disk) + profile_.pcie.overhead_us * 1e-6;
}

Nanos TimingModel::onboardDuration(int64_t host_tokens, int64_t disk_tokens) const {
  return secondsToNanosRounded(onboardSeconds(host_tokens, disk_tokens));
}

Nanos TimingModel::diskReadDuration(int64_t tokens) const {
  const double bits = kv_bytes_per_token_ * 8.0 * static_cast<double>(std::max<int64_t>(0, tokens));
  return secondsToNanosRounded(bits / (profile_.disk.read_gbps * 1e9));
}

double TimingModel::onboardReadySeconds(OnboardMode mode, int64_t host_tokens,
                                        int64_t disk_tokens) const {
  double whole = onboardSeconds(host_tokens, disk_tokens);
  if (mode == OnboardMode::kWhole || whole == 0) return whole;
  const double overhead = profile_.pcie.overhead_us * 1e-6;
  return overhead + (whole - overhead) / layers_;
}

Nanos TimingModel::onboardReadyDuration(OnboardMode mode, int64_t host_tokens,
                                        int64_t disk_tokens) const {
  return secondsToNanosRounded(onboardReadySeconds(mode, host_tokens, disk_tokens));
}

Nanos TimingModel::layeredStepDuration(Nanos compute, Nanos start, Nanos kv_ready_at) const {
  // Layer l's KV is in at start + l * Lk' (Lk' the rest of the load per layer); its compute ends
  // at max(the previous layer's end, that arrival) + Ck. Both are linear in l, so the last
  // layer ends at the larger of the two ends of that range: start + C or kv_ready_at + Ck.
  return std::max(compute, kv_ready_at + compute / layers_ - start);
}

double TimingModel::onboardedStepSeconds(OnboardMode mode, int64_t host_tokens, int64_t disk_tokens,
                                         double compute_s) const {
  double whole = onboardSeconds(host_tokens, disk_tokens);
  if (mode == OnboardMode::kWhole || whole == 0) return whole + compute_s;
  const double overhead = profile_.pcie.overhead_us * 1e-6;
  const double load_s = whole - overhead;
  return overhead + std::max(compute_s, load_s) + std::min(compute_s, load_s) / layers_;
}

}  // namespace kvf::engine
