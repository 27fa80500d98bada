#!/usr/bin/env bash
# Queued-time prefetch A/B: the G2 + G3 arm of the KV-tier A/B (agentic_g2g3.yaml, hybrid with
# tier-aware scoring, the validate half of the sessions) with tiers.prefetch.mode admission
# against queued, once per conversation-arrival seed at one offered utilisation; prints the
# summary table (experiments/report/tier_ab_summary.py, admission as the baseline).
# Needs KVF_TRACES_DIR (the agentic-coding set) and build/bin/kvf-experiment.
# Usage: experiments/sim/prefetch_ab.sh [seeds="7 8 9 10 11"] [utilisation=0.8] [host_mib]
# host_mib: host memory in MiB instead of the config's 69 (2x G1), e.g. 9 (a quarter of G1) for
# a set-up whose host memory overflows to disk.
# Environment: PREFETCH_KEYS, more tiers.prefetch keys for both arms (e.g. "budget_fraction:
# 0.5"); HALF=tune replays the tune half of the sessions instead of the validate half.
# Results: experiments/results/sim-prefetch-<mode>-u<utilisation>[-h<host_mib>][-tune]-seed<N>/.
case "${1:-}" in -h|--help) sed -n '2,12{s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${KVF_TRACES_DIR:?set KVF_TRACES_DIR to the folder holding agentic-coding/}"
seeds=${1:-7 8 9 10 11}
util=${2:-0.8}
host=${3:-}
host_edit=()
[ -n "$host" ] && host_edit=(-e "s/^      host: {capacity_mib: [0-9]*/      host: {capacity_mib: $host/")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A dirs
for mode in admission queued; do
  for s in $seeds; do
    name=sim-prefetch-$mode-u$util${host:+-h$host}${HALF:+-$HALF}-seed$s
    # The copy sits beside the original so its relative paths still resolve. One arm (tier-aware
    # scoring); the prefetch mode goes under tiers:, after the disk line.
    cfg=experiments/configs/tiers/.prefetch-$mode-$s.yaml
    sed -e "s/^name: .*/name: $name/" -e "s/^  seed: .*/  seed: $s/" \
      -e "/name: hybrid-fixed/d" \
      -e "s/^\(      disk: .*\)$/\1\n      prefetch: {mode: $mode${PREFETCH_KEYS:+, $PREFETCH_KEYS}}/" \
      -e "s/half: validate}/half: ${HALF:-validate}}/" \
      "${host_edit[@]}" \
      experiments/configs/tiers/agentic_g2g3.yaml > "$cfg"
    grep -q "prefetch: {mode: $mode" "$cfg" || { echo "no tiers.disk line in the config" >&2; exit 1; }
    echo "prefetch $mode, seed $s, utilisation $util" >&2
    rm -rf "experiments/results/$name"  # a finished earlier run would be resumed, not rerun
    build/bin/kvf-experiment sim "$cfg" --utilisation "$util" > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log" >&2; rm -f "$cfg"; exit 1; }
    rm -f "$cfg"
    dirs[$mode]+="${dirs[$mode]:+,}experiments/results/$name"
  done
done
/usr/bin/python3 experiments/report/tier_ab_summary.py "${dirs[admission]}" "${dirs[queued]}"
# The requests the admission arm onboarded from disk: their mean TTFT in both arms (paired by
# seed, 95% t-interval of the per-seed change) and their disk tokens; then the queued arm's
# promotion counters (the engines' own).
/usr/bin/python3 - "${dirs[admission]}" "${dirs[queued]}" <<'PY'
import glob, json, math, re, statistics, sys
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
def rows(d):
    out = {}
    for f in glob.glob(f"{d}/arms/*/rep0/results.jsonl"):
        for line in open(f):
            r = json.loads(line)
            if r.get("ok"):
                out[r["request_id"]] = r
    return out
changes, n, disk_a, disk_q, ttft_a, ttft_q = [], 0, 0, 0, [], []
for a_dir, q_dir in zip(sys.argv[1].split(","), sys.argv[2].split(",")):
    a, q = rows(a_dir), rows(q_dir)
    ids = [k for k, r in a.items() if r.get("disk_cached_tokens", 0) > 0 and k in q]
    if not ids:
        continue
    n += len(ids)
    disk_a += sum(a[k]["disk_cached_tokens"] for k in ids)
    disk_q += sum(q[k].get("disk_cached_tokens", 0) for k in ids)
    ma = statistics.mean(a[k]["ttft_s"] for k in ids)
    mq = statistics.mean(q[k]["ttft_s"] for k in ids)
    ttft_a.append(ma)
    ttft_q.append(mq)
    changes.append((mq / ma - 1) * 100)
if changes:
    h = T95.get(len(changes) - 1, 2.0) * statistics.stdev(changes) / math.sqrt(len(changes)) \
        if len(changes) > 1 else float("nan")
    print(f"requests with a disk prefix (admission arm): {n}; mean TTFT {statistics.mean(ttft_a):.3f} s"
          f" -> {statistics.mean(ttft_q):.3f} s ({statistics.mean(changes):+.1f}% ± {h:.1f}, "
          f"{len(changes)} seeds); their disk tokens {disk_a} -> {disk_q}")
totals = {}
for d in sys.argv[2].split(","):
    for f in glob.glob(f"{d}/arms/*/rep*/engine_*.metrics"):
        for m in re.finditer(r"^kvfabric_engine_prefetch_(\w+?)_blocks_total\{[^}]*\} (\S+)$",
                             open(f).read(), re.M):
            totals[m[1]] = totals.get(m[1], 0) + float(m[2])
print("queued arm, blocks: " + ", ".join(f"{k} {v:.0f}" for k, v in totals.items()))
PY
