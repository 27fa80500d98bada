#include "experiments/replay/summary.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace kvf::experiments {

Distribution distributionOf(std::vector<double> values) {
  Distribution d;
  d.count = values.size();
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  auto rank = [&](double p) {
    size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(values.size())));
    return values[std::min(values.size() - 1, k == 0 ? 0 : k - 1)];
  };
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  d.p50 = rank(0.50);
  d.p90 = rank(0.90);
  d.p99 = rank(0.99);
  d.max = values.back();
  return d;
}

ReplaySummary summarize(const std::vector<RequestResult>& results, double warmup_s) {
  ReplaySummary s;
  std::vector<double> ttft, tpot, e2e;
  std::map<std::string, std::vector<double>> c_ttft, c_tpot, c_e2e;
  double cached = 0, cpu = 0, disk = 0, prompt = 0;
  for (const RequestResult& r : results) {
    if (r.arrival_s < warmup_s) continue;
    std::string cls(requestClass(r.newTokens()));
    auto& row = s.by_class[cls];
    ++s.requests;
    ++row.requests;
    const CompletionOutcome& o = r.outcome;
    if (!r.endpoint.empty()) {
      auto& e = s.by_endpoint[r.endpoint];
      ++e.requests;
      e.errors += o.ok ? 0 : 1;
    }
    if (!o.ok) {
      ++s.errors;
      ++row.errors;
      continue;
    }
    ttft.push_back(o.ttft_s);
    e2e.push_back(o.e2e_s);
    c_ttft[cls].push_back(o.ttft_s);
    c_e2e[cls].push_back(o.e2e_s);
    if (o.tpot_s >= 0) {
      tpot.push_back(o.tpot_s);
      c_tpot[cls].push_back(o.tpot_s);
    }
    if (o.prompt_tokens > 0) {
      prompt += static_cast<double>(o.prompt_tokens);
      cached += static_cast<double>(std::max<int64_t>(o.cached_tokens, 0));
      cpu += static_cast<double>(o.cpu_cached_tokens);
      disk += static_cast<double>(o.disk_cached_tokens);
    }
  }
  s.ttft = distributionOf(ttft);
  s.tpot = distributionOf(tpot);
  s.e2e = distributionOf(e2e);
  s.cached_token_ratio = prompt > 0 ? cached / prompt : 0;
  s.cpu_cached_ratio = prompt > 0 ? cpu / prompt : 0;
  s.disk_cached_ratio = prompt > 0 ? disk / prompt : 0;
  for (auto& [cls, row] : s.by_class) {
    row.ttft = distributionOf(c_ttft[cls]);
    row.tpot = distributionOf(c_tpot[cls]);
    row.e2e = distributionOf(c_e2e[cls]);
  }
  return s;
}

namespace {
std::string row(const std::string& name, const Distribution& d) {
  return fmt::format("{:<14}{:>8}{:>10.3f}{:>10.3f}{:>10.3f}{:>10.3f}{:>10.3f}\n", name, d.count,
                     d.mean, d.p50, d.p90, d.p99, d.max);
}
}  // namespace

std::string formatSummary(const ReplaySummary& s) {
  std::string out = fmt::format("requests {}  errors {}  cached-token ratio {:.1f}%", s.requests,
                                s.errors, 100.0 * s.cached_token_ratio);
  if (s.cpu_cached_ratio > 0 || s.disk_cached_ratio > 0) {
    out += fmt::format(" (host memory {:.1f}%, disk {:.1f}%)", 100.0 * s.cpu_cached_ratio,
                       100.0 * s.disk_cached_ratio);
  }
  out += "\n";
  out += fmt::format("{:<14}{:>8}{:>10}{:>10}{:>10}{:>10}{:>10}\n", "metric (s)", "n", "mean",
                     "p50", "p90", "p99", "max");
  out += row("TTFT", s.ttft);
  out += row("TPOT", s.tpot);
  out += row("E2E", s.e2e);
  for (const char* cls : {"WARM", "MEDIUM", "HEAVY"}) {
    auto it = s.by_class.find(cls);
    if (it == s.by_class.end()) continue;
    out += fmt::format("-- {} ({} requests, {} errors)\n", cls, it->second.requests,
                       it->second.errors);
    out += row("  TTFT", it->second.ttft);
    out += row("  TPOT", it->second.tpot);
    out += row("  E2E", it->second.e2e);
  }
  for (const auto& [url, e] : s.by_endpoint) {
    out += fmt::format("endpoint {}: {} requests, {} errors\n", url, e.requests, e.errors);
  }
  return out;
}

}  // namespace kvf::experiments
