#include "policy/policy.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "policy/policy_support.h"

namespace kvf::policy {

std::string_view requestClassName(RequestClass c) {
  switch (c) {
    case RequestClass::kWarm:
      return "warm";
    case RequestClass::kMedium:
      return "medium";
    case RequestClass::kHeavy:
      return "heavy";
  }
  return "unknown";
}

std::string_view modeName(Mode m) {
  switch (m) {
    case Mode::kLocal:
      return "local";
    case Mode::kPushMigrate:
      return "push_migrate";
    case Mode::kPrefillOffload:
      return "prefill_offload";
  }
  return "unknown";
}

RequestClass classify(int64_t new_tokens, const ClassifyConfig& config) {
  if (new_tokens < config.warm_max_new_tokens) return RequestClass::kWarm;
  if (new_tokens <= config.medium_max_new_tokens) return RequestClass::kMedium;
  return RequestClass::kHeavy;
}

void PolicyConfig::wrongParams(std::string_view name) {
  std::fprintf(stderr, "policy parameters of \"%.*s\" requested with the wrong type or unknown\n",
               static_cast<int>(name.size()), name.data());
  std::abort();
}

namespace support {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

double uncachedWithRun(const RouteRequest& r, const InstanceSnapshot& s,
                       const TierCreditConfig& tiers) {
  return std::max(0.0, static_cast<double>(r.prompt_tokens) - tiers::effectiveHits(r, s, tiers));
}

int argmin(std::span<const InstanceSnapshot> inst, const std::vector<double>& score,
           const std::vector<double>& secondary, size_t cursor) {
  int best = -1;
  size_t n = inst.size();
  if (n == 0) return best;
  cursor %= n;
  auto consider = [&](size_t i) {
    if (!inst[i].healthy) return;
    if (best < 0 || score[i] < score[best] ||
        (score[i] == score[best] && secondary[i] < secondary[best])) {
      best = static_cast<int>(i);
    }
  };
  // From the cursor to the end, then from the start: the rotation without a division per
  // instance (which cost more than the rest of the loop at 1,024 instances).
  for (size_t i = cursor; i < n; ++i) consider(i);
  for (size_t i = 0; i < cursor; ++i) consider(i);
  return best;
}

Decision finish(const RouteRequest& r, std::span<const InstanceSnapshot> inst, int chosen,
                std::string_view reason, std::vector<double> scores, const ClassifyConfig& cc) {
  for (size_t i = 0; i < inst.size(); ++i) {
    if (!inst[i].healthy) scores[i] = kNaN;
  }
  return finishMarked(r, inst, chosen, reason, std::move(scores), cc);
}

Decision finishMarked(const RouteRequest& r, std::span<const InstanceSnapshot> inst, int chosen,
                      std::string_view reason, std::vector<double> scores,
                      const ClassifyConfig& cc) {
  Decision d;
  d.instance = chosen;
  d.reason = chosen < 0 ? std::string_view("no_healthy_instance") : reason;
  d.scores = std::move(scores);
  int64_t cached = chosen < 0 ? 0 : std::min(inst[chosen].matched_tokens, r.prompt_tokens);
  d.predicted_cached_tokens = cached;
  d.request_class = classify(r.prompt_tokens - cached, cc);
  return d;
}

double averageRunning(std::span<const InstanceSnapshot> inst) {
  double running_sum = 0;
  int healthy = 0;
  for (const auto& s : inst) {
    if (!s.healthy) continue;
    running_sum += static_cast<double>(s.running);
    ++healthy;
  }
  return healthy > 0 ? running_sum / healthy : 0.0;
}

}  // namespace support
}  // namespace kvf::policy
