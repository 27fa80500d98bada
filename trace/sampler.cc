#include "trace/sampler.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "absl/container/flat_hash_map.h"
#include "common/splitmix.h"
#include "common/status.h"

namespace kvf::trace {

namespace {

uint64_t mix64(uint64_t x) { return splitmix64(x); }

uint64_t hashText(std::string_view s, uint64_t seed) {
  uint64_t h = mix64(seed ^ 0x5A17ULL);
  for (char c : s) h = mix64(h ^ static_cast<unsigned char>(c));
  return mix64(h ^ s.size());
}

constexpr uint64_t kRandomBaselineSalt = 0xBA5E'11CEULL;

struct SessionInfo {
  Nanos first = 0;
  uint32_t requests = 0;
  bool in_window = false;
  bool kept = false;
};

// Requests without a session id become their own session, keyed by their position.
std::string sessionKey(const Request& r, int64_t index) {
  if (!r.session_id.empty()) return r.session_id;
  return strCat("\x01#", index);
}

absl::Status validate(const SampleOptions& o) {
  if (!(o.sample_ratio > 0 && o.sample_ratio <= 1)) {
    return absl::InvalidArgumentError("sample ratio must be in (0, 1]");
  }
  if (!(o.max_single_turn_ratio >= 0 && o.max_single_turn_ratio <= 1)) {
    return absl::InvalidArgumentError("max single-turn ratio must be in [0, 1]");
  }
  if (!(o.window_start_s >= 0)) return absl::InvalidArgumentError("window start must be >= 0");
  return absl::OkStatus();
}

// Thinning and the single-turn cap over the sessions in the window.
int64_t chooseSessions(absl::flat_hash_map<std::string, SessionInfo>& sessions,
                       const SampleOptions& o) {
  const uint64_t threshold =
      o.sample_ratio >= 1 ? ~uint64_t{0} : static_cast<uint64_t>(std::ldexp(o.sample_ratio, 64));
  std::vector<std::pair<uint64_t, SessionInfo*>> single;
  int64_t multi = 0;
  for (auto& [key, info] : sessions) {
    if (!info.in_window) continue;
    uint64_t h = hashText(key, o.seed);
    info.kept = o.sample_ratio >= 1 || h < threshold;
    if (!info.kept) continue;
    if (info.requests >= 2) {
      ++multi;
    } else {
      single.emplace_back(mix64(h), &info);
    }
  }
  auto singles = static_cast<int64_t>(single.size());
  if (o.max_single_turn_ratio < 1) {
    // singles / (singles + multi) <= cap  <=>  singles <= cap * multi / (1 - cap)
    auto allowed = static_cast<int64_t>(std::floor(
        o.max_single_turn_ratio * static_cast<double>(multi) / (1 - o.max_single_turn_ratio) +
        1e-9));
    if (singles > allowed) {
      std::sort(single.begin(), single.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t i = static_cast<size_t>(allowed); i < single.size(); ++i) {
        single[i].second->kept = false;
      }
      singles = allowed;
    }
  }
  return multi + singles;
}

}  // namespace

absl::StatusOr<SampleReport> sampleTrace(const std::string& path, const ReaderOptions& reader,
                                         const SampleOptions& options,
                                         const StatsOptions& stats_options, SessionWriter* out) {
  KVF_RETURN_IF_ERROR(validate(options));
  KVF_ASSIGN_OR_RETURN(auto input_acc, StatsAccumulator::create(stats_options));
  absl::flat_hash_map<std::string, SessionInfo> sessions;
  Request r;
  Nanos origin = 0;
  int64_t index = 0;
  {
    KVF_ASSIGN_OR_RETURN(auto in, openTrace(path, reader));
    while (true) {
      KVF_ASSIGN_OR_RETURN(bool more, in->next(&r));
      if (!more) break;
      if (index == 0 || r.arrival < origin) origin = r.arrival;
      input_acc.add(r);
      auto [it, inserted] = sessions.try_emplace(sessionKey(r, index));
      if (inserted || r.arrival < it->second.first) it->second.first = r.arrival;
      ++it->second.requests;
      ++index;
    }
  }
  const Nanos start = origin + secondsToNanos(options.window_start_s);
  const Nanos end = options.window_s > 0 ? start + secondsToNanos(options.window_s)
                                         : std::numeric_limits<Nanos>::max();
  SampleReport report;
  for (auto& [key, info] : sessions) {
    info.in_window = info.first >= start && info.first < end;
    report.sessions_in_window += info.in_window;
  }
  report.sessions_kept = chooseSessions(sessions, options);
  KVF_ASSIGN_OR_RETURN(auto window_acc, StatsAccumulator::create(stats_options));
  KVF_ASSIGN_OR_RETURN(auto sample_acc, StatsAccumulator::create(stats_options));
  KVF_ASSIGN_OR_RETURN(auto random_acc, StatsAccumulator::create(stats_options));
  // The baseline the seed warns about: as many sessions, drawn at random from the whole trace.
  const double random_ratio = static_cast<double>(report.sessions_kept) /
                              static_cast<double>(std::max<size_t>(1, sessions.size()));
  const uint64_t random_threshold =
      random_ratio >= 1 ? ~uint64_t{0} : static_cast<uint64_t>(std::ldexp(random_ratio, 64));
  KVF_ASSIGN_OR_RETURN(auto in, openTrace(path, reader));
  index = 0;
  while (true) {
    KVF_ASSIGN_OR_RETURN(bool more, in->next(&r));
    if (!more) break;
    const std::string key = sessionKey(r, index++);
    const SessionInfo& info = sessions.at(key);
    if (hashText(key, options.seed ^ kRandomBaselineSalt) <= random_threshold) random_acc.add(r);
    if (!info.in_window) continue;
    if (options.rebase_time) r.arrival -= start;
    window_acc.add(r);
    if (!info.kept) continue;
    sample_acc.add(r);
    if (out != nullptr) KVF_RETURN_IF_ERROR(out->write(r));
  }
  report.input = input_acc.finish();
  report.window = window_acc.finish();
  report.sample = sample_acc.finish();
  report.random = random_acc.finish();
  return report;
}

std::string formatSampleReport(const SampleReport& rep) {
  std::string o;
  const TraceStats* cols[4] = {&rep.input, &rep.window, &rep.sample, &rep.random};
  auto row = [&](std::string_view name, auto get, bool percent) {
    fmt::format_to(std::back_inserter(o), "{:<34}", name);
    for (const TraceStats* c : cols) {
      double v = get(*c);
      if (percent) {
        fmt::format_to(std::back_inserter(o), " {:>11.2f}%", v * 100);
      } else {
        fmt::format_to(std::back_inserter(o), " {:>12.6g}", v);
      }
    }
    o += "\n";
  };
  fmt::format_to(std::back_inserter(o), "{:<34} {:>12} {:>12} {:>12} {:>12}\n", "", "input",
                 "window", "sample", "random");
  using S = const TraceStats&;
  row(
      "requests", [](S s) { return static_cast<double>(s.requests); }, false);
  row(
      "sessions", [](S s) { return static_cast<double>(s.sessions); }, false);
  row(
      "multi-turn sessions", [](S s) { return s.multi_turn_share; }, true);
  row(
      "turns per session", [](S s) { return s.turns_per_session; }, false);
  row(
      "span (s)", [](S s) { return s.span_s; }, false);
  row(
      "input mean", [](S s) { return s.input.mean; }, false);
  row(
      "unlimited cache hit (token)", [](S s) { return s.hit_all.token; }, true);
  row(
      "unlimited cache hit (block)", [](S s) { return s.hit_all.block; }, true);
  row(
      "cross-session share of reuse", [](S s) { return s.cross_session_reuse; }, true);
  row(
      "blocks shared by >1 session", [](S s) { return s.blocks_shared_across_sessions; }, true);
  row(
      "  weighted by occurrences", [](S s) { return s.block_occurrences_shared_across_sessions; },
      true);
  fmt::format_to(std::back_inserter(o),
                 "sessions starting in the window: {}, kept: {}; 'random' keeps about as many "
                 "sessions drawn from the whole trace (the sampling the seed warns against)\n",
                 rep.sessions_in_window, rep.sessions_kept);
  return o;
}

}  // namespace kvf::trace
