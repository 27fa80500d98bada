#!/usr/bin/env bash
# Runs the KV-tier A/B (agentic_g1/g2/g2g3.yaml) once per conversation-arrival seed at one
# offered utilisation and prints the summary table (experiments/report/tier_ab_summary.py).
# Optionally each seed runs several repetitions whose request overheads jitter by up to
# jitter_ms (the configs' 1 ms keeps every arm on one routing trajectory; a larger jitter shows
# how much the figures depend on timing). Needs KVF_TRACES_DIR (the agentic-coding set) and
# build/bin/kvf-experiment.
# Usage: experiments/sim/tier_ab.sh [seeds="7 8 9 10 11"] [utilisation=0.6] [jitter_ms=1] [reps=1]
# Results: experiments/results/sim-tiers-agentic-<tiers>-u<utilisation>[-j<jitter>]-seed<N>/.
case "${1:-}" in -h|--help) sed -n '2,9{s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${KVF_TRACES_DIR:?set KVF_TRACES_DIR to the folder holding agentic-coding/}"
seeds=${1:-7 8 9 10 11}
util=${2:-0.6}
jitter=${3:-1}
reps=${4:-1}
tag=$([[ $jitter == 1 && $reps == 1 ]] || echo "-j$jitter")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A dirs
for t in g1 g2 g2g3; do
  for s in $seeds; do
    name=sim-tiers-agentic-$t-u$util$tag-seed$s
    # The copy sits beside the original so its relative paths still resolve.
    cfg=experiments/configs/tiers/.seed-$t-$s.yaml
    sed -e "s/^name: .*/name: $name/" -e "s/^  seed: .*/  seed: $s/" \
      -e "s/^repetitions: .*/repetitions: $reps/" -e "s/jitter_ms: 1}/jitter_ms: $jitter}/" \
      "experiments/configs/tiers/agentic_$t.yaml" > "$cfg"
    echo "tiers $t, seed $s, utilisation $util, jitter $jitter ms x $reps" >&2
    build/bin/kvf-experiment sim "$cfg" --utilisation "$util" > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log" >&2; rm -f "$cfg"; exit 1; }
    rm -f "$cfg"
    dirs[$t]+="${dirs[$t]:+,}experiments/results/$name"
  done
done
/usr/bin/python3 experiments/report/tier_ab_summary.py "${dirs[g1]}" "${dirs[g2]}" "${dirs[g2g3]}"
