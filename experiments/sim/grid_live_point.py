#!/usr/bin/python3
"""One live point of the policy grid, to check the simulator against the live cluster: a slice
of a grid experiment's validate half at one offered utilisation, run live (`kvf-experiment
run`: emulated engines and kvf-router) and simulated (`kvf-experiment sim`, jittered
repetitions) from the same derived experiment file, then compared with
experiments/report/compare_live_sim.py (per arm: TTFT p50/p90, E2E p50 and hit ratio, live
against the pooled simulation and the range of its repetitions).

usage: grid_live_point.py CONFIG [--utilisation 0.6] [--duration_s 600] [--time_scale 4]
                          [--arms round_robin,hybrid] [--sim_repetitions 4]
                          [--bin build/bin/kvf-experiment] [--out experiments/results/grid/live]
"""
import argparse
import os
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from policy_grid import derived_config  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--utilisation", type=float, default=0.6)
    ap.add_argument("--duration_s", type=float, default=600,
                    help="window of the trace (trace seconds from its start) before the split")
    ap.add_argument("--time_scale", type=float, default=4,
                    help="replay and engine time scale (arrivals and modelled clocks this much faster)")
    ap.add_argument("--arms", default="round_robin,hybrid")
    ap.add_argument("--sim_repetitions", type=int, default=4)
    ap.add_argument("--bin", default="build/bin/kvf-experiment")
    ap.add_argument("--out", default="experiments/results/grid/live")
    args = ap.parse_args()
    if args.utilisation <= 0 or args.duration_s <= 0 or args.time_scale <= 0 or args.sim_repetitions < 1:
        ap.error("--utilisation, --duration_s, --time_scale and --sim_repetitions must be positive")
    name = os.path.splitext(os.path.basename(args.config))[0]
    with open(args.config) as f:
        doc = yaml.safe_load(f)
    wanted = args.arms.split(",")
    arms = [a for a in doc["arms"] if a["name"] in wanted]
    if len(arms) != len(wanted):
        ap.error(f"--arms: {args.config} has arms {[a['name'] for a in doc['arms']]}")
    out = os.path.join(args.out, f"{name}_u{args.utilisation}")
    path = derived_config(args.config, os.path.join(out, "experiment.yaml"), "validate", arms)
    with open(path) as f:
        derived = yaml.safe_load(f)
    derived["trace"]["duration_s"] = args.duration_s
    derived["load"] = {"utilisation": args.utilisation}
    derived["replay"]["time_scale"] = args.time_scale
    derived["cluster"]["engine_time_scale"] = args.time_scale
    derived["repetitions"] = 1
    derived.setdefault("sim", {})["repetitions"] = args.sim_repetitions
    with open(path, "w") as f:
        yaml.safe_dump(derived, f, sort_keys=False)
    live, sim = os.path.join(out, "live"), os.path.join(out, "sim")
    for cmd in ([args.bin, "run", path, "--output_dir", live],
                [args.bin, "sim", path, "--output_dir", sim, "--jobs", "2"]):
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)
    subprocess.run(["/usr/bin/python3", os.path.join(HERE, "..", "report", "compare_live_sim.py"),
                    live, sim, "--plot", os.path.join(out, "live_vs_sim_ttft.png")], check=True)


if __name__ == "__main__":
    main()
