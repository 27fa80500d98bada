#include "policy/move_feedback.h"

#include <algorithm>
#include <cmath>

namespace kvf::policy {
namespace {

bool inRange(int slot) { return slot >= 0 && slot < kMaxInstances; }

uint32_t linkKey(int source, int dest) {
  return static_cast<uint32_t>(source) * kMaxInstances + static_cast<uint32_t>(dest);
}

}  // namespace

void MoveFeedback::Estimate::add(double sample, double weight) {
  // The first sample is taken as it is: starting from 0 (no bias) would need many samples to
  // reach a link that is 3x slow, and min_samples already guards against one outlier.
  log_ratio = samples == 0 ? sample : (1 - weight) * log_ratio + weight * sample;
  ++samples;
}

void MoveFeedback::record(int source, int dest, double predicted_s, double measured_s) {
  if (!inRange(source) || !inRange(dest) || !(predicted_s > 0) || !(measured_s > 0) ||
      !std::isfinite(predicted_s) || !std::isfinite(measured_s)) {
    return;
  }
  // One wild sample moves the estimate at most to the bound.
  const double sample = clamp(std::log(measured_s / predicted_s));
  link(source, dest).add(sample, config_.weight);
  sources_[static_cast<size_t>(source)].add(sample, config_.weight);
}

double MoveFeedback::clamp(double log_ratio) const {
  return std::clamp(log_ratio, std::log(config_.min_factor), std::log(config_.max_factor));
}

const MoveFeedback::Estimate* MoveFeedback::link(int source, int dest) const {
  if (source < kDense && dest < kDense) {
    return &dense_links_[static_cast<size_t>(source) * kDense + static_cast<size_t>(dest)];
  }
  auto it = sparse_links_.find(linkKey(source, dest));
  return it == sparse_links_.end() ? nullptr : &it->second;
}

MoveFeedback::Estimate& MoveFeedback::link(int source, int dest) {
  if (source < kDense && dest < kDense) {
    return dense_links_[static_cast<size_t>(source) * kDense + static_cast<size_t>(dest)];
  }
  return sparse_links_[linkKey(source, dest)];
}

double MoveFeedback::factor(int source, int dest) const {
  if (!inRange(source) || !inRange(dest)) return 1.0;
  const Estimate* l = link(source, dest);
  if (l != nullptr && l->samples >= config_.min_samples) return std::exp(clamp(l->log_ratio));
  const Estimate& src = sources_[static_cast<size_t>(source)];
  if (src.samples >= config_.min_samples) return std::exp(clamp(src.log_ratio));
  return 1.0;
}

int64_t MoveFeedback::linkSamples(int source, int dest) const {
  if (!inRange(source) || !inRange(dest)) return 0;
  const Estimate* l = link(source, dest);
  return l == nullptr ? 0 : l->samples;
}

int64_t MoveFeedback::sourceSamples(int source) const {
  return inRange(source) ? sources_[static_cast<size_t>(source)].samples : 0;
}

void MoveFeedback::forget(int slot) {
  if (!inRange(slot)) return;
  sources_[static_cast<size_t>(slot)] = {};
  for (int other = 0; other < kDense && slot < kDense; ++other) {
    dense_links_[static_cast<size_t>(slot) * kDense + static_cast<size_t>(other)] = {};
    dense_links_[static_cast<size_t>(other) * kDense + static_cast<size_t>(slot)] = {};
  }
  absl::erase_if(sparse_links_, [slot](const auto& entry) {
    return static_cast<int>(entry.first / kMaxInstances) == slot ||
           static_cast<int>(entry.first % kMaxInstances) == slot;
  });
}

}  // namespace kvf::policy
