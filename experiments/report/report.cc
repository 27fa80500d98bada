#include "experiments/report/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "experiments/replay/summary.h"
#include "experiments/report/prom_text.h"
#include "experiments/report/report_summary.h"

namespace kvf::experiments {

namespace fs = std::filesystem;

namespace {

absl::StatusOr<std::string> readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(strCat("cannot open ", path.string()));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<std::string> armNames(const fs::path& dir) {
  std::vector<std::string> names;
  if (auto text = readFile(dir / "arms.txt"); text.ok()) {
    std::istringstream in(*text);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) names.push_back(line);
    }
    return names;
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir / "arms", ec)) {
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status loadCacheMetrics(const fs::path& rep_dir, ArmData* arm) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(rep_dir, ec)) {
    std::string file = entry.path().filename().string();
    if (file.rfind("engine_", 0) != 0 || entry.path().extension() != ".metrics") continue;
    std::string instance = file.substr(7, file.size() - 7 - 8);
    auto text = readFile(entry.path());
    if (!text.ok()) return text.status();
    auto samples = parsePromText(*text);
    if (!samples.ok()) return annotate(samples.status(), entry.path().string());
    auto& [hits, queries] = arm->instance_cache[instance];
    hits += sumOf(*samples, "vllm:prefix_cache_hits_total").value_or(0);
    queries += sumOf(*samples, "vllm:prefix_cache_queries_total").value_or(0);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ArmData>> loadExperiment(const std::string& dir_text) {
  fs::path dir(dir_text);
  std::vector<ArmData> arms;
  for (const std::string& name : armNames(dir)) {
    ArmData arm;
    arm.name = name;
    std::vector<fs::path> reps;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir / "arms" / name, ec)) {
      if (entry.is_directory() && fs::exists(entry.path() / "results.jsonl")) {
        reps.push_back(entry.path());
      }
    }
    std::sort(reps.begin(), reps.end());
    for (const fs::path& rep : reps) {
      auto results = loadResults((rep / "results.jsonl").string());
      if (!results.ok()) return results.status();
      arm.reps.push_back(std::move(*results));
      KVF_RETURN_IF_ERROR(loadCacheMetrics(rep, &arm));
    }
    if (!arm.reps.empty()) arms.push_back(std::move(arm));
  }
  if (arms.empty()) return absl::NotFoundError(strCat("no results under ", dir_text, "/arms"));
  return arms;
}

Delta bootstrapDelta(const std::vector<std::vector<double>>& baseline,
                     const std::vector<std::vector<double>>& arm,
                     double (*stat)(std::vector<double>&), int resamples, uint64_t seed) {
  auto pooled = [](const std::vector<std::vector<double>>& reps) {
    std::vector<double> all;
    for (const auto& r : reps) all.insert(all.end(), r.begin(), r.end());
    return all;
  };
  Delta d;
  std::vector<double> b_all = pooled(baseline), a_all = pooled(arm);
  if (b_all.empty() || a_all.empty()) return d;
  double b_stat = stat(b_all), a_stat = stat(a_all);
  d.value = b_stat != 0 ? a_stat / b_stat - 1 : 0;
  std::mt19937_64 rng(seed);
  auto draw = [&rng](const std::vector<std::vector<double>>& reps) {
    std::vector<double> sample;
    std::uniform_int_distribution<size_t> pick_rep(0, reps.size() - 1);
    for (size_t k = 0; k < reps.size(); ++k) {
      const auto& rep = reps[pick_rep(rng)];
      if (rep.empty()) continue;
      std::uniform_int_distribution<size_t> pick(0, rep.size() - 1);
      for (size_t i = 0; i < rep.size(); ++i) sample.push_back(rep[pick(rng)]);
    }
    return sample;
  };
  std::vector<double> deltas;
  for (int i = 0; i < resamples; ++i) {
    auto b = draw(baseline), a = draw(arm);
    if (b.empty() || a.empty()) continue;
    double bs = stat(b);
    if (bs != 0) deltas.push_back(stat(a) / bs - 1);
  }
  if (deltas.empty()) return d;
  std::sort(deltas.begin(), deltas.end());
  d.low = deltas[static_cast<size_t>(0.025 * static_cast<double>(deltas.size() - 1))];
  d.high = deltas[static_cast<size_t>(0.975 * static_cast<double>(deltas.size() - 1))];
  return d;
}

namespace {

double statMean(std::vector<double>& v) { return distributionOf(v).mean; }
double statP50(std::vector<double>& v) { return distributionOf(v).p50; }
double statP90(std::vector<double>& v) { return distributionOf(v).p90; }
double statP99(std::vector<double>& v) { return distributionOf(v).p99; }

enum class Field { kTtft, kTpot, kE2e };

std::vector<std::vector<double>> valuesPerRep(const ArmData& arm, Field field) {
  std::vector<std::vector<double>> out;
  for (const auto& rep : arm.reps) {
    std::vector<double> v;
    for (const auto& r : rep) {
      if (!r.outcome.ok) continue;
      double x = field == Field::kTtft   ? r.outcome.ttft_s
                 : field == Field::kTpot ? r.outcome.tpot_s
                                         : r.outcome.e2e_s;
      if (x >= 0) v.push_back(x);
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<RequestResult> pooledResults(const ArmData& arm) {
  std::vector<RequestResult> all;
  for (const auto& rep : arm.reps) all.insert(all.end(), rep.begin(), rep.end());
  return all;
}

std::string pct(double v) { return fmt::format("{:+.1f}%", 100 * v); }

void latencyTable(std::string& md, const std::vector<ArmData>& arms,
                  const std::vector<ReplaySummary>& sums, const std::vector<ArmBalance>& balances) {
  md +=
      "| arm | requests | errors | APC | TTFT mean | TTFT p50 | TTFT p90 | TTFT p99 | TPOT p50 | "
      "TPOT p90 | TPOT p99 | E2E p50 | E2E p90 | E2E p99 | prefill ahead | req max/mean | "
      "tok max/mean |\n";
  md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < arms.size(); ++i) {
    const auto& s = sums[i];
    md += fmt::format(
        "| {} | {} | {} | {:.1f}% | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.4f} | {:.4f} | {:.4f} "
        "| {:.3f} | {:.3f} | {:.3f} | {:.0f} | {:.2f} | {:.2f} |\n",
        arms[i].name, s.requests, s.errors, 100 * clusterHitRatio(arms[i], s), s.ttft.mean,
        s.ttft.p50, s.ttft.p90, s.ttft.p99, s.tpot.p50, s.tpot.p90, s.tpot.p99, s.e2e.p50,
        s.e2e.p90, s.e2e.p99, balances[i].prefill_ahead_tokens, balances[i].max_over_mean_requests,
        balances[i].max_over_mean_tokens);
  }
}

void deltaTable(std::string& md, const std::vector<ArmData>& arms) {
  if (arms.size() < 2) return;
  struct Column {
    const char* name;
    Field field;
    double (*stat)(std::vector<double>&);
  };
  const Column columns[] = {
      {"TTFT mean", Field::kTtft, statMean}, {"TTFT p50", Field::kTtft, statP50},
      {"TTFT p90", Field::kTtft, statP90},   {"TPOT p50", Field::kTpot, statP50},
      {"TPOT p90", Field::kTpot, statP90},   {"E2E p50", Field::kE2e, statP50},
      {"E2E p90", Field::kE2e, statP90},     {"E2E p99", Field::kE2e, statP99}};
  md += fmt::format("\n## Change against the baseline ({})\n\n", arms[0].name);
  md +=
      "Relative change of each statistic, with its 95% bootstrap interval (1,000 resamples of "
      "repetitions, then of requests within each drawn repetition).\n\n| arm |";
  for (const auto& c : columns) md += fmt::format(" {} |", c.name);
  md += "\n|---|";
  for (size_t i = 0; i < std::size(columns); ++i) md += "---|";
  md += "\n";
  for (size_t a = 1; a < arms.size(); ++a) {
    md += "| " + arms[a].name + " |";
    for (const auto& c : columns) {
      Delta d =
          bootstrapDelta(valuesPerRep(arms[0], c.field), valuesPerRep(arms[a], c.field), c.stat);
      md += fmt::format(" {} [{}, {}] |", pct(d.value), pct(d.low), pct(d.high));
    }
    md += "\n";
  }
}

void instanceTables(std::string& md, const std::vector<ArmData>& arms) {
  md += "\n## Per-instance prefix-cache hit ratio and routing mix\n\n";
  for (const auto& arm : arms) {
    std::map<std::string, int64_t> routed;
    std::map<std::string, int64_t> decisions;
    for (const auto& r : pooledResults(arm)) {
      routed[r.outcome.instance.empty() ? "?" : r.outcome.instance]++;
      if (!r.outcome.decision.empty()) decisions[r.outcome.decision]++;
    }
    md += fmt::format("**{}**: ", arm.name);
    std::vector<std::string> parts;
    for (const auto& [name, hq] : arm.instance_cache) {
      parts.push_back(
          fmt::format("inst_{}={:.1f}%", name, hq.second > 0 ? 100 * hq.first / hq.second : 0.0));
    }
    md += parts.empty() ? "(no engine metrics)" : strJoin(parts, ", ");
    md += "  \nrequests per instance: ";
    parts.clear();
    for (const auto& [name, n] : routed) parts.push_back(fmt::format("{}={}", name, n));
    md += strJoin(parts, ", ");
    if (!decisions.empty()) {
      parts.clear();
      for (const auto& [name, n] : decisions) parts.push_back(fmt::format("{}={}", name, n));
      md += "  \ndecisions: " + strJoin(parts, ", ");
    }
    md += "\n\n";
  }
}

void classTables(std::string& md, const std::vector<ArmData>& arms,
                 const std::vector<ReplaySummary>& sums) {
  md += "## Per-class breakdown (WARM < 5k new tokens, MEDIUM 5-20k, HEAVY > 20k)\n\n";
  md += "| arm | class | requests | errors | TTFT p50 | TTFT p90 | TPOT p90 | E2E p50 |\n";
  md += "|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < arms.size(); ++i) {
    for (const char* cls : {"WARM", "MEDIUM", "HEAVY"}) {
      auto it = sums[i].by_class.find(cls);
      if (it == sums[i].by_class.end()) continue;
      const auto& row = it->second;
      md += fmt::format("| {} | {} | {} | {} | {:.3f} | {:.3f} | {:.4f} | {:.3f} |\n", arms[i].name,
                        cls, row.requests, row.errors, row.ttft.p50, row.ttft.p90, row.tpot.p90,
                        row.e2e.p50);
    }
  }
}

absl::Status writeCsvs(const fs::path& dir, const std::vector<ArmData>& arms) {
  fs::create_directories(dir / "data");
  std::ofstream latencies(dir / "data" / "latencies.csv");
  latencies << "arm,rep,request_id,instance,sent_s,ttft_s,tpot_s,e2e_s,ok\n";
  for (const auto& arm : arms) {
    for (size_t k = 0; k < arm.reps.size(); ++k) {
      for (const auto& r : arm.reps[k]) {
        latencies << fmt::format("{},{},{},{},{:.6f},{:.6f},{:.6f},{:.6f},{}\n", arm.name, k,
                                 r.request_id, r.outcome.instance, r.sent_s, r.outcome.ttft_s,
                                 r.outcome.tpot_s, r.outcome.e2e_s, r.outcome.ok ? 1 : 0);
      }
    }
  }
  std::ofstream cache(dir / "data" / "instance_cache.csv");
  cache << "arm,instance,hits,queries\n";
  for (const auto& arm : arms) {
    for (const auto& [name, hq] : arm.instance_cache) {
      cache << fmt::format("{},{},{},{}\n", arm.name, name, hq.first, hq.second);
    }
  }
  if (!latencies || !cache) return absl::InternalError("writing report data");
  return absl::OkStatus();
}

}  // namespace

std::string installedScript(const std::string& name) {
  std::error_code ec;
  fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) return name;
  if (!fs::exists(dir / name) && fs::exists(dir / ".." / "bin" / name)) {
    return (dir / ".." / "bin" / name).lexically_normal().string();
  }
  return (dir / name).string();
}

absl::StatusOr<std::string> writeReport(const std::string& dir_text, bool plots) {
  KVF_ASSIGN_OR_RETURN(std::vector<ArmData> arms, loadExperiment(dir_text));
  fs::path dir(dir_text);
  KVF_ASSIGN_OR_RETURN(ExperimentSetup setup, readSetup(dir_text));
  setup.repetitions = static_cast<int>(arms[0].reps.size());
  std::vector<ReplaySummary> sums;
  std::vector<ArmBalance> balances;
  for (const auto& arm : arms) {
    sums.push_back(summarize(pooledResults(arm)));
    balances.push_back(balanceOf(arm, setup.engines));
  }
  std::string md = fmt::format("# Experiment report: {}\n\n", dir.filename().string());
  md += setupParagraph(setup);
  md += fmt::format(
      "{} arm(s); baseline: **{}**. Seconds unless noted. APC: the cluster prefix-cache hit "
      "ratio (token level, from the engines' /metrics). prefill ahead: uncached prompt tokens "
      "of earlier requests still waiting for their first token on the serving instance when a "
      "request was sent (mean; queueing). req max/mean, tok max/mean: the "
      "busiest instance's requests and prompt tokens over the mean per instance (1.00 = even).\n\n",
      arms.size(), arms[0].name);
  latencyTable(md, arms, sums, balances);
  md += "\n" + whyParagraph(arms, sums, balances);
  deltaTable(md, arms);
  instanceTables(md, arms);
  classTables(md, arms, sums);
  KVF_RETURN_IF_ERROR(writeCsvs(dir, arms));
  if (plots) {
    std::string script = installedScript("kvf-plot-report.py");
    std::string cmd = strCat("/usr/bin/python3 '", script, "' '", dir.string(), "'");
    if (std::system(cmd.c_str()) != 0) {
      log::warn("plots not written (needs /usr/bin/python3 with matplotlib)", "dir", dir.string());
    } else {
      md +=
          "\n## Plots\n\n![TTFT CDF](plots/ttft_cdf.png)\n![E2E CDF](plots/e2e_cdf.png)\n"
          "![Per-instance APC](plots/instance_apc.png)\n![Load over time](plots/load.png)\n";
    }
  }
  std::ofstream out(dir / "report.md");
  out << md;
  if (!out) return absl::InternalError(strCat("cannot write ", (dir / "report.md").string()));
  return md;
}

}  // namespace kvf::experiments
