#!/usr/bin/env bash
# The simulator's speed goal (docs/benchmarks.md, "Simulator"): one arm's CPU time, measured
# the way the documented figures are. Each run is the arm in its own process
# (`kvf-experiment sim EXP --sim_arm ARM --sim_rep 0`), and its `cpu_s` (getrusage around the
# simulation) is read from the log line.
#
# With --baseline OTHER_BIN, the two binaries alternate run by run. This shared VM's speed moves
# 10-15% between minutes, so only pairs taken side by side say which build is faster. The
# script then reports the median of the per-pair ratios and whether both wrote byte-identical
# results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
  cat <<'EOF'
Usage: experiments/bench/sim_speed.sh [options]
  --config EXP.yaml   experiment file (default experiments/configs/sim_mooncake_speed.yaml)
  --arm NAME          the arm to time (default: the experiment's first arm)
  --runs N            timed runs per binary (default 5)
  --bin BIN           kvf-experiment to time (default build/bin/kvf-experiment)
  --baseline BIN      a second kvf-experiment, alternated with --bin run by run
  --csv FILE          also write one line per run: binary,run,cpu_s,load1
  --dir DIR           working folder (default: a fresh temporary one, removed at the end)
  -h, --help          this text
A first untimed run cuts the trace slice into DIR/trace.jsonl (the parent's job in
`kvf-experiment sim`). Progress goes to stderr and the summary to stdout.
EOF
}

config=experiments/configs/sim_mooncake_speed.yaml
arm=""
runs=5
bin=build/bin/kvf-experiment
baseline=""
csv=""
dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --arm) arm=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "sim_speed.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$runs" in
  '' | *[!0-9]* | 0) echo "sim_speed.sh: --runs must be a positive integer, got '$runs'" >&2; exit 2 ;;
esac
[ -f "$config" ] || { echo "sim_speed.sh: --config: no file '$config'" >&2; exit 2; }
for b in "$bin" ${baseline:+"$baseline"}; do
  [ -x "$b" ] || { echo "sim_speed.sh: '$b' is not an executable kvf-experiment" >&2; exit 2; }
done
py=/usr/bin/python3

cleanup=""
if [ -z "$dir" ]; then
  dir=$(mktemp -d /tmp/kvf-sim-speed.XXXXXX)
  cleanup=$dir
fi
trap 'if [ -n "$cleanup" ]; then rm -rf "$cleanup"; fi' EXIT

echo "sim_speed: cutting the trace slice into $dir (untimed run)" >&2
"$bin" sim "$config" --output_dir "$dir" --jobs 1 --plots=false > "$dir/first.log" 2>&1 || {
  tail -20 "$dir/first.log" >&2
  exit 1
}
if [ -z "$arm" ]; then arm=$(head -1 "$dir/arms.txt"); fi
grep -qx "$arm" "$dir/arms.txt" || {
  echo "sim_speed.sh: --arm: the experiment has no arm '$arm' (it has: $(tr '\n' ' ' < "$dir/arms.txt"))" >&2
  exit 2
}

load1() { cut -d' ' -f1 /proc/loadavg; }
# One timed run of binary $1 labelled $2: prints cpu_s, keeps the results as $dir/$2.jsonl.
timed() {
  local log="$dir/$2.log"
  "$1" sim "$config" --output_dir "$dir" --sim_arm "$arm" --sim_rep 0 > "$log" 2>&1 || {
    tail -20 "$log" >&2
    exit 1
  }
  cp "$dir/arms/$arm/rep0/results.jsonl" "$dir/$2.jsonl"
  grep -o 'cpu_s=[0-9.]*' "$log" | tail -1 | cut -d= -f2
}

rows="$dir/rows.csv"
echo "binary,run,cpu_s,load1" > "$rows"
identical=yes
for i in $(seq "$runs"); do
  if [ -n "$baseline" ]; then
    s=$(timed "$baseline" baseline)
    echo "baseline,$i,$s,$(load1)" >> "$rows"
  fi
  s=$(timed "$bin" bin)
  echo "bin,$i,$s,$(load1)" >> "$rows"
  if [ -n "$baseline" ] && ! cmp -s "$dir/baseline.jsonl" "$dir/bin.jsonl"; then identical=no; fi
  echo "sim_speed: run $i/$runs: $(tail -n "$([ -n "$baseline" ] && echo 2 || echo 1)" "$rows" |
    awk -F, '{printf "%s %.3f s  ", $1, $3}')" >&2
done
if [ -n "$csv" ]; then cp "$rows" "$csv"; fi

"$py" - "$rows" "$config" "$arm" "$identical" "${baseline:+1}" <<'EOF'
import csv, statistics as st, sys
rows, config, arm, identical, paired = sys.argv[1:6]
by = {}
load = []
for r in csv.DictReader(open(rows)):
    by.setdefault(r["binary"], []).append(float(r["cpu_s"]))
    load.append(float(r["load1"]))
print(f"{config}, arm {arm}: cpu_s per run (1-min load {min(load):.2f}-{max(load):.2f})")
for name in ("baseline", "bin"):
    v = by.get(name)
    if v:
        print(f"  {name:8s} min {min(v):.3f}  median {st.median(v):.3f}  max {max(v):.3f}  "
              f"runs: {' '.join(f'{x:.2f}' for x in v)}")
if paired:
    ratios = [b / a for a, b in zip(by["baseline"], by["bin"])]
    faster = sum(r < 1 for r in ratios)
    print(f"  bin / baseline, median of {len(ratios)} pairs: {st.median(ratios):.3f} "
          f"({faster} of {len(ratios)} pairs faster); results byte-identical: {identical}")
EOF
