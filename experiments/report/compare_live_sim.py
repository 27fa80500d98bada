#!/usr/bin/python3
"""Compare a live run (`kvf-experiment run`) with its simulation (`kvf-experiment sim`) of the
same experiment file: per arm, TTFT p50/p90, E2E p50 and the cluster hit ratio of the live run
against the simulation pooled over its repetitions, plus the range over the simulated
repetitions (each one a draw of the overhead jitter, as the live run is one draw of its timing
noise). Writes a Markdown table to stdout and, with --plot, a TTFT CDF per arm (live against
every simulated repetition).

  /usr/bin/python3 experiments/report/compare_live_sim.py LIVE_DIR SIM_DIR [--plot OUT.png]
"""
import argparse
import glob
import json
import os
import sys


def percentile(values, q):
    """Nearest-rank percentile, the definition the report uses."""
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(q * len(values) + 0.999999) - 1))]


def load_rep(rep_dir):
    rows = []
    with open(os.path.join(rep_dir, "results.jsonl")) as f:
        for line_no, line in enumerate(f, 1):
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                sys.exit(f"{rep_dir}/results.jsonl:{line_no}: not JSON ({e})")
    hits = queries = 0.0
    for path in glob.glob(os.path.join(rep_dir, "engine_*.metrics")):
        with open(path) as f:
            for line in f:
                if line.startswith("vllm:prefix_cache_hits_total"):
                    hits += float(line.split()[-1])
                elif line.startswith("vllm:prefix_cache_queries_total"):
                    queries += float(line.split()[-1])
    ok = [r for r in rows if r.get("ok")]
    return {
        "ttft": [r["ttft_s"] for r in ok],
        "e2e": [r["e2e_s"] for r in ok],
        "errors": len(rows) - len(ok),
        "hits": hits,
        "queries": queries,
    }


def stats(reps):
    ttft = [v for r in reps for v in r["ttft"]]
    e2e = [v for r in reps for v in r["e2e"]]
    queries = sum(r["queries"] for r in reps)
    return {
        "APC": 100.0 * sum(r["hits"] for r in reps) / queries if queries else float("nan"),
        "TTFT p50": percentile(ttft, 0.5),
        "TTFT p90": percentile(ttft, 0.9),
        "E2E p50": percentile(e2e, 0.5),
        "TTFT mean": sum(ttft) / len(ttft) if ttft else float("nan"),
    }


def arm_reps(run_dir, arm):
    reps = sorted(glob.glob(os.path.join(run_dir, "arms", arm, "rep*")))
    return [load_rep(d) for d in reps if os.path.exists(os.path.join(d, "DONE"))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("live_dir")
    parser.add_argument("sim_dir")
    parser.add_argument("--plot", help="write TTFT CDFs (live vs each simulated repetition)")
    args = parser.parse_args()
    arms_file = os.path.join(args.live_dir, "arms.txt")
    if not os.path.exists(arms_file):
        sys.exit(f"{arms_file}: missing (not a kvf-experiment result folder)")
    arms = [a for a in open(arms_file).read().split() if a]
    print("| arm | metric | live | simulated (pooled) | difference | simulated repetitions |")
    print("|---|---|---|---|---|---|")
    curves = {}
    for arm in arms:
        live = arm_reps(args.live_dir, arm)
        sim = arm_reps(args.sim_dir, arm)
        if not live or not sim:
            print(f"| {arm} | missing in {'live' if not live else 'sim'} | | | | |")
            continue
        ls, ss = stats(live), stats(sim)
        per_rep = [stats([r]) for r in sim]
        for metric in ["TTFT p50", "TTFT p90", "E2E p50", "APC", "TTFT mean"]:
            lo = min(p[metric] for p in per_rep)
            hi = max(p[metric] for p in per_rep)
            fmt = "{:.1f}%" if metric == "APC" else "{:.3f}"
            diff = 100.0 * (ss[metric] - ls[metric]) / ls[metric] if ls[metric] else float("nan")
            print(f"| {arm} | {metric} | {fmt.format(ls[metric])} | {fmt.format(ss[metric])} | "
                  f"{diff:+.1f}% | {fmt.format(lo)} - {fmt.format(hi)} ({len(sim)}) |")
        curves[arm] = (live, sim)
    if args.plot and curves:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4.2), squeeze=False)
        for ax, (arm, (live, sim)) in zip(axes[0], curves.items()):
            for i, rep in enumerate(sim):
                v = sorted(rep["ttft"])
                ax.plot(v, [(k + 1) / len(v) for k in range(len(v))], color="tab:blue",
                        alpha=0.35, lw=1, label="simulated repetitions" if i == 0 else None)
            v = sorted(live[0]["ttft"])
            ax.plot(v, [(k + 1) / len(v) for k in range(len(v))], color="tab:red", lw=2,
                    label="live")
            ax.set_xscale("log")
            ax.set_xlabel("TTFT (s)")
            ax.set_ylabel("fraction of requests")
            ax.set_title(arm)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
