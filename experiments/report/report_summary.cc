#include "experiments/report/report_summary.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "common/strings.h"
#include "trace/reader.h"

namespace kvf::experiments {

namespace fs = std::filesystem;

namespace {

// A value from a YAML map, or `fallback` when it is absent or of another type.
template <class T>
T yamlOr(const YAML::Node& map, const char* key, T fallback) {
  if (!map.IsMap() || !map[key]) return fallback;
  try {
    return map[key].as<T>();
  } catch (const YAML::Exception&) {
    return fallback;
  }
}

std::string thousands(double value) {
  auto n = static_cast<int64_t>(std::llround(value));
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string scaleText(double s) { return fmt::format("{:g}", s); }

void readExperimentFile(const fs::path& file, ExperimentSetup* s) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());
  } catch (const YAML::Exception&) {
    return;
  }
  s->recorded = true;
  YAML::Node trace = root["trace"], replay = root["replay"], cluster = root["cluster"];
  s->trace_path = yamlOr<std::string>(trace, "path", "");
  s->start_s = yamlOr(trace, "start_s", 0.0);
  s->duration_s = yamlOr(trace, "duration_s", 0.0);
  s->limit = yamlOr<int64_t>(trace, "limit", 0);
  s->dispatch = yamlOr<std::string>(replay, "dispatch", "timestamp");
  s->time_scale = yamlOr(replay, "time_scale", 1.0);
  s->engines = yamlOr(cluster, "engines", 8);
  s->engine_config =
      fs::path(yamlOr<std::string>(cluster, "engine_config", "")).filename().string();
  s->engine_time_scale = yamlOr(cluster, "engine_time_scale", 1.0);
}

// The prompt tokens each request still had to prefill: not served from cache.
double uncachedTokens(const RequestResult& r) {
  double prompt =
      static_cast<double>(r.outcome.prompt_tokens >= 0 ? r.outcome.prompt_tokens : r.input_length);
  return std::max(0.0, prompt - static_cast<double>(std::max<int64_t>(r.outcome.cached_tokens, 0)));
}

// For each request of one repetition: the uncached prompt tokens of the requests sent before it
// to the same instance that had not yet produced their first token when it was sent. Returns
// their sum over the requests, and the number of requests.
std::pair<double, int64_t> prefillAheadAtSend(const std::vector<RequestResult>& rep) {
  struct Span {
    double start, first_token, tokens;
  };
  std::map<std::string, std::vector<Span>> per_instance;
  for (const auto& r : rep) {
    if (!r.outcome.ok || r.outcome.ttft_s < 0) continue;
    // A zero TTFT still ends after it starts, so "started before s" covers "ended by s".
    double first = r.sent_s + std::max(r.outcome.ttft_s, 1e-9);
    per_instance[r.outcome.instance].push_back({r.sent_s, first, uncachedTokens(r)});
  }
  double sum = 0;
  int64_t n = 0;
  for (auto& [instance, spans] : per_instance) {
    // Prefix sums of tokens by start and by first-token time: ahead(s) = started(< s) - done(<= s).
    auto prefix = [&spans](auto key) {
      std::vector<std::pair<double, double>> v;
      for (const Span& sp : spans) v.emplace_back(key(sp), sp.tokens);
      std::sort(v.begin(), v.end());
      for (size_t i = 1; i < v.size(); ++i) v[i].second += v[i - 1].second;
      return v;
    };
    auto started = prefix([](const Span& sp) { return sp.start; });
    auto done = prefix([](const Span& sp) { return sp.first_token; });
    auto tokensBefore = [](const std::vector<std::pair<double, double>>& v, double t,
                           bool inclusive) {
      auto it = inclusive ? std::upper_bound(v.begin(), v.end(), std::make_pair(t, 1e300))
                          : std::lower_bound(v.begin(), v.end(), std::make_pair(t, -1e300));
      return it == v.begin() ? 0.0 : std::prev(it)->second;
    };
    for (const Span& sp : spans) {
      sum += tokensBefore(started, sp.start, false) - tokensBefore(done, sp.start, true);
      ++n;
    }
  }
  return {sum, n};
}

}  // namespace

absl::StatusOr<ExperimentSetup> readSetup(const std::string& dir_text) {
  fs::path dir(dir_text);
  ExperimentSetup s;
  readExperimentFile(dir / "experiment.yaml", &s);
  // `run` keeps the router config of every repetition; the simulator has no router process.
  std::error_code ec;
  s.simulated = true;
  for (const auto& arm : fs::directory_iterator(dir / "arms", ec)) {
    if (fs::exists(arm.path() / "rep0" / "router.yaml")) s.simulated = false;
  }
  if (!fs::exists(dir / "trace.jsonl")) return s;
  trace::ReaderOptions reader;
  reader.format = trace::TraceFormat::kSession;
  auto slice = trace::readAll((dir / "trace.jsonl").string(), reader);
  if (!slice.ok()) return slice.status();
  s.requests = static_cast<int64_t>(slice->size());
  if (slice->empty()) return s;
  Nanos first = slice->front().arrival, last = first;
  double input = 0, output = 0;
  for (const auto& r : *slice) {
    first = std::min(first, r.arrival);
    last = std::max(last, r.arrival);
    input += static_cast<double>(r.input_length);
    output += static_cast<double>(r.output_length);
  }
  s.span_s = static_cast<double>(last - first) / 1e9;
  s.mean_input_tokens = input / static_cast<double>(s.requests);
  s.mean_output_tokens = output / static_cast<double>(s.requests);
  if (s.span_s > 0) {
    s.offered_requests_per_s = static_cast<double>(s.requests) / s.span_s;
    s.offered_prompt_tokens_per_s_per_engine = input / s.span_s / std::max(1, s.engines);
  }
  return s;
}

std::string setupParagraph(const ExperimentSetup& s) {
  if (!s.recorded) {
    return "**Setup.** Not recorded: the result directory has no experiment.yaml, so this report "
           "cannot say which trace slice, cluster and time scale produced it.\n\n";
  }
  std::string window =
      s.duration_s > 0 ? fmt::format("trace seconds {:g}-{:g}", s.start_s, s.start_s + s.duration_s)
                       : fmt::format("trace seconds {:g} to the end", s.start_s);
  if (s.limit > 0) window += fmt::format(", at most {} requests", s.limit);
  std::string out = fmt::format(
      "**Setup.** {} requests from `{}` ({}), spanning {:.0f} s of trace time; mean prompt {} "
      "tokens, mean output {}; sent by {}. {} {} engines{}, {} for every arm and repetition; {} "
      "per arm.\n\n",
      thousands(static_cast<double>(s.requests)),
      s.trace_path.empty() ? "(unknown trace)" : fs::path(s.trace_path).filename().string(), window,
      s.span_s, thousands(s.mean_input_tokens), thousands(s.mean_output_tokens),
      s.dispatch == "session" ? "session (a turn after the previous one and its think time)"
                              : "timestamp (open loop)",
      s.simulated ? "Simulated:" : "Live:", s.engines,
      s.engine_config.empty() ? "" : fmt::format(" (`{}`)", s.engine_config),
      s.simulated ? "a fresh simulated cluster" : "fresh, cold engine processes and router",
      s.repetitions == 1 ? std::string("one repetition")
                         : fmt::format("{} repetitions", s.repetitions));
  std::string clock = s.simulated ? "virtual seconds of the simulation" : "wall-clock seconds";
  if (s.time_scale == 1 && s.engine_time_scale == 1) {
    out += fmt::format("**Time scale 1**: real time; every time below is in {}.", clock);
  } else {
    out += fmt::format(
        "**Time scale {}**: requests were sent {}x faster than their trace times and the engines' "
        "modelled clocks ran {}x, so every time below is in {}; multiply by {} for modelled "
        "seconds.",
        scaleText(s.time_scale), scaleText(s.time_scale), scaleText(s.engine_time_scale), clock,
        scaleText(s.engine_time_scale));
    if (s.time_scale != s.engine_time_scale) {
      out +=
          " The replay and engine time scales differ, so the engines modelled a different "
          "load than the trace's.";
    }
  }
  out += fmt::format(
      " **Offered load** (trace time): {:.2f} requests/s, {} prompt tokens/s per engine; ",
      s.offered_requests_per_s, thousands(s.offered_prompt_tokens_per_s_per_engine));
  out += s.offered_utilisation
             ? fmt::format("offered utilisation {:.0f}% of the cluster's modelled capacity.\n\n",
                           100 * *s.offered_utilisation)
             : "offered utilisation: not computed yet (the offered load is what the harness "
               "knows).\n\n";
  return out;
}

double clusterHitRatio(const ArmData& arm, const ReplaySummary& summary) {
  double hits = 0, queries = 0;
  for (const auto& [name, hq] : arm.instance_cache) {
    hits += hq.first;
    queries += hq.second;
  }
  return queries > 0 ? hits / queries : summary.cached_token_ratio;
}

ArmBalance balanceOf(const ArmData& arm, int instances) {
  ArmBalance b;
  std::map<std::string, std::pair<int64_t, double>> per_instance;  // requests, prompt tokens
  for (const auto& [name, hq] : arm.instance_cache) per_instance[name];
  double ahead = 0;
  int64_t requests = 0;
  for (const auto& rep : arm.reps) {
    auto [rep_ahead, rep_requests] = prefillAheadAtSend(rep);
    ahead += rep_ahead;
    requests += rep_requests;
    for (const auto& r : rep) {
      if (r.outcome.instance.empty()) continue;
      auto& [n, tokens] = per_instance[r.outcome.instance];
      ++n;
      tokens += static_cast<double>(r.outcome.prompt_tokens >= 0 ? r.outcome.prompt_tokens
                                                                 : r.input_length);
    }
  }
  b.prefill_ahead_tokens = requests > 0 ? ahead / static_cast<double>(requests) : 0;
  if (per_instance.empty()) return b;
  int64_t total = 0, max_n = -1;
  double total_tokens = 0, max_tokens = 0;
  b.least_requests = INT64_MAX;
  for (const auto& [name, nt] : per_instance) {
    total += nt.first;
    total_tokens += nt.second;
    max_tokens = std::max(max_tokens, nt.second);
    if (nt.first > max_n) {
      max_n = nt.first;
      b.busiest = name;
    }
    b.least_requests = std::min(b.least_requests, nt.first);
  }
  size_t count = std::max(per_instance.size(), static_cast<size_t>(std::max(instances, 0)));
  if (count > per_instance.size()) b.least_requests = 0;  // an instance that served nothing
  b.busiest_requests = max_n;
  double n = static_cast<double>(count);
  b.max_over_mean_requests = total > 0 ? static_cast<double>(max_n) / (total / n) : 0;
  b.max_over_mean_tokens = total_tokens > 0 ? max_tokens / (total_tokens / n) : 0;
  return b;
}

std::string whyParagraph(const std::vector<ArmData>& arms, const std::vector<ReplaySummary>& sums,
                         const std::vector<ArmBalance>& balances) {
  if (arms.empty()) return "";
  auto hit = [&](size_t i) { return 100 * clusterHitRatio(arms[i], sums[i]); };
  auto figures = [&](size_t i) {
    return fmt::format(
        "hit ratio {:.1f}%, {} prompt tokens queued for prefill ahead of a request on its "
        "instance, busiest instance {:.2f}x the mean requests and {:.2f}x the mean prompt tokens",
        hit(i), thousands(balances[i].prefill_ahead_tokens), balances[i].max_over_mean_requests,
        balances[i].max_over_mean_tokens);
  };
  if (arms.size() == 1) {
    return fmt::format("**Why.** One arm, nothing to compare: TTFT mean {:.3f} s with {}.\n",
                       sums[0].ttft.mean, figures(0));
  }
  size_t best = 0, worst = 0, worst_p99 = 0;
  for (size_t i = 1; i < arms.size(); ++i) {
    if (sums[i].ttft.mean < sums[best].ttft.mean) best = i;
    if (sums[i].ttft.mean > sums[worst].ttft.mean) worst = i;
    if (sums[i].ttft.p99 > sums[worst_p99].ttft.p99) worst_p99 = i;
  }
  const std::string &bn = arms[best].name, &wn = arms[worst].name;
  double ratio = sums[best].ttft.mean > 0 ? sums[worst].ttft.mean / sums[best].ttft.mean : 0.0;
  std::string out = fmt::format(
      "**Why.** {} has the lowest mean TTFT ({:.3f} s) and {} the highest ({:.3f} s, {:.2f}x). ",
      bn, sums[best].ttft.mean, wn, sums[worst].ttft.mean, ratio);
  if (ratio < 1.05) {
    out += fmt::format(
        "They differ by {:.1f}%, which a repetition's noise can give: read the 95% intervals "
        "below before calling a winner. ",
        100 * (ratio - 1));
  }
  out += fmt::format("{}: {}. {}: {}. ", bn, figures(best), wn, figures(worst));

  const ArmBalance &b = balances[best], &w = balances[worst];
  double hit_gap = hit(best) - hit(worst);
  bool worst_queues_more = w.prefill_ahead_tokens > 1.15 * b.prefill_ahead_tokens;
  bool worst_queues_less = b.prefill_ahead_tokens > 1.15 * w.prefill_ahead_tokens;
  std::string queue = fmt::format("{} vs {} tokens queued ahead", thousands(w.prefill_ahead_tokens),
                                  thousands(b.prefill_ahead_tokens));
  if (std::abs(hit_gap) < 1.0) {
    out += worst_queues_more
               ? fmt::format(
                     "Their hit ratios are within a point, so queueing separates them: "
                     "{}'s requests wait behind more prefill ({}).",
                     wn, queue)
               : "Their hit ratios are within a point and so is their queueing on average: the "
                 "difference is in which requests met a busy instance (the load plot shows when).";
  } else if (hit_gap > 0) {
    out += worst_queues_less
               ? fmt::format(
                     "{} queues more prefill, but its {:.1f} points more cache hits save "
                     "more prefill than its queue costs.",
                     bn, hit_gap)
               : fmt::format(
                     "{} serves {:.1f} points more of the prompts from cache and queues no "
                     "more prefill: both favour it.",
                     bn, hit_gap);
  } else {
    out += worst_queues_more
               ? fmt::format(
                     "{} hits the cache more ({:+.1f} points) but its requests wait behind "
                     "more prefill ({}): the queueing costs more than its hits save.",
                     wn, -hit_gap, queue)
               : fmt::format(
                     "{} hits the cache more ({:+.1f} points) and queues no more prefill on "
                     "average, so its higher TTFT comes from queueing bursts on some "
                     "instances (the load plot shows where).",
                     wn, -hit_gap);
  }
  // The arm whose load is the most uneven, when it is clearly uneven.
  auto imbalance = [&](size_t i) {
    return std::max(balances[i].max_over_mean_requests, balances[i].max_over_mean_tokens);
  };
  size_t uneven = 0;
  for (size_t i = 1; i < arms.size(); ++i) {
    if (imbalance(i) > imbalance(uneven)) uneven = i;
  }
  if (imbalance(uneven) >= 1.3) {
    const ArmBalance& u = balances[uneven];
    out += fmt::format(
        " The most uneven load is {}'s: its busiest instance ({}) took {} requests, {:.2f}x the "
        "mean, and {:.2f}x the mean prompt tokens; its least busy took {} requests.",
        arms[uneven].name, u.busiest, u.busiest_requests, u.max_over_mean_requests,
        u.max_over_mean_tokens, u.least_requests);
  }
  if (worst_p99 != worst) {
    out += fmt::format(
        " The worst TTFT p99 is {}'s ({:.3f} s; its busiest instance took {:.2f}x the mean "
        "requests).",
        arms[worst_p99].name, sums[worst_p99].ttft.p99, balances[worst_p99].max_over_mean_requests);
  }
  for (size_t i = 0; i < arms.size(); ++i) {
    if (sums[i].errors > 0) {
      out += fmt::format(" {} had {} failed requests (left out of the latencies).", arms[i].name,
                         sums[i].errors);
    }
  }
  return out + "\n";
}

std::string terminalSummary(const std::string& md) {
  size_t section = md.find("\n## ");
  return section == std::string::npos ? md : md.substr(0, section + 1);
}

}  // namespace kvf::experiments
