// The sweep part of the simulator's report: one row per swept arm (with the unswept arm it
// derives from as the reference), DIR/data/sweep.csv, and one plot per sweep drawn by
// plot_sweep.py (Debian's /usr/bin/python3 with matplotlib).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "experiments/replay/summary.h"
#include "experiments/report/report.h"
#include "experiments/sim/sim_runner.h"

namespace kvf::experiments::sim {

namespace fs = std::filesystem;

namespace {

struct Row {
  ReplaySummary summary;
  double apc = 0;
};

Row rowOf(const ArmData& arm) {
  std::vector<RequestResult> all;
  for (const auto& rep : arm.reps) all.insert(all.end(), rep.begin(), rep.end());
  Row row;
  row.summary = summarize(all);
  double hits = 0, queries = 0;
  for (const auto& [name, hq] : arm.instance_cache) {
    hits += hq.first;
    queries += hq.second;
  }
  row.apc = queries > 0 ? hits / queries : row.summary.cached_token_ratio;
  return row;
}

}  // namespace

absl::Status writeSweepReport(const std::string& dir, const std::vector<SimArm>& arms,
                              const std::vector<Sweep>& sweeps, bool plots) {
  if (sweeps.empty()) return absl::OkStatus();
  KVF_ASSIGN_OR_RETURN(std::vector<ArmData> data, loadExperiment(dir));
  std::map<std::string, Row> rows;
  for (const ArmData& arm : data) rows[arm.name] = rowOf(arm);
  fs::create_directories(fs::path(dir) / "data");
  std::ofstream csv(fs::path(dir) / "data" / "sweep.csv");
  csv << "sweep,param,base_arm,value,arm,requests,errors,apc,ttft_mean,ttft_p50,ttft_p90,"
         "ttft_p99,tpot_p50,e2e_p50,e2e_p90\n";
  std::string md = "\n## Sweeps\n\n";
  md +=
      "Each swept arm is its base arm with one parameter set to the value; the `base` rows are "
      "the base arms as configured.\n";
  for (size_t s = 0; s < sweeps.size(); ++s) {
    md += fmt::format("\n### Sweep {}: `{}`\n\n", s, sweeps[s].param);
    md +=
        "| arm | value | errors | APC | TTFT mean | TTFT p50 | TTFT p90 | TTFT p99 | TPOT p50 | "
        "E2E p50 | E2E p90 |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    auto emit = [&](const std::string& base, const std::string& value, const std::string& name) {
      auto it = rows.find(name);
      if (it == rows.end()) return;
      const ReplaySummary& x = it->second.summary;
      csv << fmt::format(
          "{},{},{},{},{},{},{},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f}\n", s,
          sweeps[s].param, base, value, name, x.requests, x.errors, it->second.apc, x.ttft.mean,
          x.ttft.p50, x.ttft.p90, x.ttft.p99, x.tpot.p50, x.e2e.p50, x.e2e.p90);
      md += fmt::format(
          "| {} | {} | {} | {:.1f}% | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.4f} | {:.3f} | {:.3f} "
          "|\n",
          name, value, x.errors, 100 * it->second.apc, x.ttft.mean, x.ttft.p50, x.ttft.p90,
          x.ttft.p99, x.tpot.p50, x.e2e.p50, x.e2e.p90);
    };
    std::vector<std::string> bases;
    for (const SimArm& arm : arms) {
      if (arm.sweep_index != static_cast<int>(s)) continue;
      if (std::find(bases.begin(), bases.end(), arm.base_arm) == bases.end()) {
        bases.push_back(arm.base_arm);
        emit(arm.base_arm, "base", arm.base_arm);
      }
      emit(arm.base_arm, arm.value, arm.name);
    }
    if (plots) md += fmt::format("\n![sweep {}](plots/sweep_{}.png)\n", s, s);
  }
  csv.close();
  if (!csv) return absl::InternalError(strCat("cannot write ", dir, "/data/sweep.csv"));
  if (plots) {
    std::string cmd =
        strCat("/usr/bin/python3 '", installedScript("kvf-plot-sweep.py"), "' '", dir, "'");
    if (std::system(cmd.c_str()) != 0) {
      log::warn("sweep plots not written (needs /usr/bin/python3 with matplotlib)", "dir", dir);
    }
  }
  std::ofstream out(fs::path(dir) / "report.md", std::ios::app);
  out << md;
  return out ? absl::OkStatus()
             : absl::InternalError(strCat("cannot append to ", dir, "/report.md"));
}

}  // namespace kvf::experiments::sim
