#include "policy/move_feedback.h"

#include <algorithm>
#include <cmath>

namespace kvf::policy {
namespace {

bool inRange(int slot) { return slot >= 0 && slot < kMaxInstances; }

size_t linkIndex(int source, int dest) {
  return static_cast<size_t>(source) * kMaxInstances + static_cast<size_t>(dest);
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
  links_[linkIndex(source, dest)].add(sample, config_.weight);
  sources_[static_cast<size_t>(source)].add(sample, config_.weight);
}

double MoveFeedback::clamp(double log_ratio) const {
  return std::clamp(log_ratio, std::log(config_.min_factor), std::log(config_.max_factor));
}

double MoveFeedback::factor(int source, int dest) const {
  if (!inRange(source) || !inRange(dest)) return 1.0;
  const Estimate& link = links_[linkIndex(source, dest)];
  if (link.samples >= config_.min_samples) return std::exp(clamp(link.log_ratio));
  const Estimate& src = sources_[static_cast<size_t>(source)];
  if (src.samples >= config_.min_samples) return std::exp(clamp(src.log_ratio));
  return 1.0;
}

int64_t MoveFeedback::linkSamples(int source, int dest) const {
  return inRange(source) && inRange(dest) ? links_[linkIndex(source, dest)].samples : 0;
}

int64_t MoveFeedback::sourceSamples(int source) const {
  return inRange(source) ? sources_[static_cast<size_t>(source)].samples : 0;
}

void MoveFeedback::forget(int slot) {
  if (!inRange(slot)) return;
  sources_[static_cast<size_t>(slot)] = {};
  for (int other = 0; other < kMaxInstances; ++other) {
    links_[linkIndex(slot, other)] = {};
    links_[linkIndex(other, slot)] = {};
  }
}

}  // namespace kvf::policy
