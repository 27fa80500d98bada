#!/usr/bin/env bash
# The seed's section 3.4 question across load, in the simulator: session-sticky `linear`
# against `lmetric` (no affinity) and `hybrid`, on two sessioned traces, at several arrival
# rates, 8 emulated H20 engines with 256k context, session dispatch, real time.
#   - agentic: the agentic-coding conversations (an optional trace set: $KVF_TRACES_DIR/
#     agentic-coding, data/traces/README.md), the first 1,200 s of conversation arrivals at
#     each rate in CONV_RATES (conversations per second);
#   - synth: the seed-statistics synthetic trace (kvf-trace synth, 4,000 requests) thinned to
#     each session share in SYNTH_SHARES (`kvf-trace sample --sample_ratio`).
# Writes OUT/summary.csv (one line per trace x load x arm) and OUT/lmetric_vs_linear.png.
# Usage: experiments/bench/lmetric_vs_linear.sh [OUT=experiments/results/lmetric-vs-linear]
# (PLOT_ONLY=1: only redo summary.csv and the plot from OUT/runs.)

# -h/--help prints the comment above; any other flag is a usage error (exit 2).
case "${1:-}" in
  -h|--help) sed -n '2,/^$/{/^$/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  -*) echo "$0: unknown flag '$1' (see $0 --help)" >&2; exit 2 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
out=$(realpath -m "${1:-experiments/results/lmetric-vs-linear}")
bin=${KVF_BIN_DIR:-build/bin}
traces=${KVF_TRACES_DIR:-}
if [ -z "${PLOT_ONLY:-}" ] && [ ! -d "$traces/agentic-coding" ]; then
  echo "$0: needs the optional agentic-coding trace set: set KVF_TRACES_DIR (data/traces/README.md)" >&2
  exit 1
fi
conv_rates=${CONV_RATES:-"0.0125 0.025 0.05 0.1 0.2"}
synth_shares=${SYNTH_SHARES:-"0.25 0.5 1"}
mkdir -p "$out/configs" "$out/runs"
if [ -z "${PLOT_ONLY:-}" ]; then

arms='arms:
  - {name: linear, policy: {kind: linear}}
  - {name: lmetric, policy: {kind: lmetric}}
  - {name: hybrid, policy: {kind: hybrid}}'
common="replay: {dispatch: session, time_scale: 1, timeout_s: 2400}
cluster: {engines: 8, engine_config: $root/engine/configs/engine_256k.yaml}
sim: {decision_log: false}
$arms"

for r in $conv_rates; do
  cat > "$out/configs/agentic_$r.yaml" <<EOF
name: agentic-$r
trace: {path: $traces/agentic-coding, format: agentic, conversation_rate: $r, seed: 7,
        duration_s: 1200, max_input_tokens: 245760}
$common
EOF
done
"$bin/kvf-trace" synth --requests 4000 --output "$out/runs/synth4k.jsonl" --progress=false
for s in $synth_shares; do
  if [ "$s" = 1 ]; then cp "$out/runs/synth4k.jsonl" "$out/runs/synth_$s.jsonl"; else
    "$bin/kvf-trace" sample "$out/runs/synth4k.jsonl" --window_start_s 0 --window_s 100000 \
      --sample_ratio "$s" --seed 3 --output "$out/runs/synth_$s.jsonl" --progress=false >/dev/null
  fi
  cat > "$out/configs/synth_$s.yaml" <<EOF
name: synth-$s
trace: {path: $out/runs/synth_$s.jsonl}
$common
EOF
done

for cfg in "$out"/configs/*.yaml; do
  name=$(basename "$cfg" .yaml)
  echo "== $name ($(date -u +%H:%M:%S))"
  "$bin/kvf-experiment" sim "$cfg" --jobs 1 --plots=false --output_dir "$out/runs/$name" \
    > "$out/runs/$name.log" 2>&1
done
fi

/usr/bin/python3 - "$out" <<'EOF'
import csv, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

out = sys.argv[1]
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))] if v else float("nan")

rows = []
for name in sorted(os.listdir(os.path.join(out, "runs"))):
    lat = os.path.join(out, "runs", name, "data", "latencies.csv")
    if not os.path.exists(lat):
        continue
    trace, load = name.split("_", 1)
    by_arm = {}
    for r in csv.DictReader(open(lat)):
        by_arm.setdefault(r["arm"], []).append(r)
    cache = {}
    for r in csv.DictReader(open(os.path.join(out, "runs", name, "data", "instance_cache.csv"))):
        h, q = cache.get(r["arm"], (0, 0))
        cache[r["arm"]] = (h + int(r["hits"]), q + int(r["queries"]))
    for arm, rs in by_arm.items():
        ok = [r for r in rs if r["ok"] == "1"]
        ttft = [float(r["ttft_s"]) for r in ok]
        e2e = [float(r["e2e_s"]) for r in ok]
        h, q = cache.get(arm, (0, 1))
        rows.append(dict(trace=trace, load=float(load), arm=arm, requests=len(rs),
                         errors=len(rs) - len(ok), apc=h / max(q, 1),
                         ttft_mean=sum(ttft) / max(len(ttft), 1), ttft_p50=pct(ttft, 0.5),
                         ttft_p90=pct(ttft, 0.9), e2e_p50=pct(e2e, 0.5)))
rows.sort(key=lambda r: (r["trace"], r["load"], r["arm"]))
with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)

fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
titles = {"agentic": "agentic coding (load = conversations/s)",
          "synth": "seed-statistics synthetic (load = session share)"}
for ax, trace in zip(axes, ["agentic", "synth"]):
    base = {r["load"]: r for r in rows if r["trace"] == trace and r["arm"] == "linear"}
    for arm, style in [("lmetric", "o-"), ("hybrid", "s--")]:
        for metric, color in [("ttft_p50", "C0"), ("ttft_mean", "C1"), ("e2e_p50", "C2")]:
            pts = sorted((r["load"], r[metric] / base[r["load"]][metric]) for r in rows
                         if r["trace"] == trace and r["arm"] == arm and r["load"] in base)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color,
                        label=f"{arm} {metric}", alpha=1.0 if arm == "lmetric" else 0.5)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhspan(0.98, 1.02, color="grey", alpha=0.2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    loads = sorted(base)
    ax.xaxis.set_major_locator(FixedLocator(loads))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_major_locator(FixedLocator([0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5, 2, 3]))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_title(titles[trace], fontsize=10)
    ax.set_xlabel("load")
    ax.set_ylabel("ratio to linear (< 1: better than linear)")
axes[0].legend(fontsize=7)
fig.tight_layout()
fig.savefig(os.path.join(out, "lmetric_vs_linear.png"), dpi=110)
print("wrote", os.path.join(out, "summary.csv"), "and lmetric_vs_linear.png")
EOF
