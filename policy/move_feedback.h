// Closed-loop correction of predicted KV-move costs: what moves did cost (measured by the
// driver: the decision log's realised transfer time, the engines' kv_transfer_result timings)
// against what the cost model predicted, as an exponentially weighted mean of
// log(measured / predicted) per link (source -> destination) and per source, bounded, and
// applied only after a minimum number of samples. A policy multiplies its predicted move time
// by factor(source, dest): the link's own correction once it has enough samples, else the
// source's (its decode load and queue slow every push it serves), else 1. Pure, owned by one
// policy, single-threaded like it.
#pragma once

#include <array>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "policy/holder_set.h"

namespace kvf::policy {

struct MoveFeedbackConfig {
  double weight = 0.2;      // EWMA weight of the newest sample (in log space)
  int64_t min_samples = 5;  // a link's (or source's) samples before its correction applies
  double min_factor = 0.25;
  double max_factor = 8.0;  // corrections are clamped to [min_factor, max_factor]
};

class MoveFeedback {
 public:
  explicit MoveFeedback(MoveFeedbackConfig config = {}) : config_(config) {}

  // One measured move: `predicted_s` the model's move time (before any correction),
  // `measured_s` what it took. Ignored unless both are positive and finite or a slot is out of
  // range.
  void record(int source, int dest, double predicted_s, double measured_s);
  // The multiplier for a predicted move from `source` to `dest` (1 without enough samples).
  double factor(int source, int dest) const;
  int64_t linkSamples(int source, int dest) const;
  int64_t sourceSamples(int source) const;
  // Forgets an instance's links and its source entry (its slot was reused).
  void forget(int slot);

 private:
  struct Estimate {
    double log_ratio = 0;
    int64_t samples = 0;
    void add(double log_ratio_sample, double weight);
  };
  double clamp(double log_ratio) const;
  // The link's estimate; null (const) or inserted (mutable) when it has none.
  const Estimate* link(int source, int dest) const;
  Estimate& link(int source, int dest);

  // Links between the first kDense slots (every link of a small cluster) live in an array;
  // the rest, sparse among up to kMaxInstances^2, in a hash map.
  static constexpr int kDense = 64;
  MoveFeedbackConfig config_;
  std::array<Estimate, static_cast<size_t>(kDense) * kDense> dense_links_{};
  absl::flat_hash_map<uint32_t, Estimate> sparse_links_;
  std::array<Estimate, kMaxInstances> sources_{};
};

}  // namespace kvf::policy
