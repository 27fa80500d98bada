#!/usr/bin/env bash
# 8 emulated engines on this machine: idle CPU per instance, then trace-sized load at a fixed
# rate (kvf-engine-load), then each engine's step-lateness figures from /metrics.
# Usage: experiments/bench/engine_perf.sh [rate=40] [duration_s=60] [time_scale=1] [n=8]
# Environment: TRACE (default data/traces/mooncake/conversation_trace.jsonl), KVF_BIN_DIR.

# -h/--help prints the comment above; any other flag is a usage error (exit 2).
case "${1:-}" in
  -h|--help) sed -n '2,/^$/{/^$/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  -*) echo "$0: unknown flag '$1' (see $0 --help)" >&2; exit 2 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/../.."
rate=${1:-40}; duration=${2:-60}; scale=${3:-1}; n=${4:-8}
bin=${KVF_BIN_DIR:-build/bin}
trace=${TRACE:-data/traces/mooncake/conversation_trace.jsonl}
dir=$(mktemp -d /tmp/kvf_engine_perf.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
targets=""
for i in $(seq 0 $((n - 1))); do
  port=$((18100 + i))
  "$bin/kvf-engine" --config engine/configs/engine.yaml --port "$port" --instance_id "e$i" \
    --kv_events_endpoint "tcp://127.0.0.1:$((18200 + i))" \
    --kv_replay_endpoint "tcp://127.0.0.1:$((18300 + i))" --time_scale "$scale" \
    > "$dir/e$i.log" 2>&1 &
  pids+=($!)
  targets+="${targets:+,}127.0.0.1:$port"
done
for i in $(seq 0 $((n - 1))); do
  for _ in $(seq 100); do grep -q "kvf-engine ready" "$dir/e$i.log" && break; sleep 0.1; done
done
cpu_ticks() { local t=0; for p in "${pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat))); done; echo $t; }
hz=$(getconf CLK_TCK)
echo "load before idle measurement: $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(cpu_ticks); sleep 10; t1=$(cpu_ticks)
echo "idle CPU per instance over 10 s: $(echo "scale=3; ($t1 - $t0) * 100 / $hz / 10 / $n" | bc) %"
echo "load before run: $(cut -d' ' -f1-3 /proc/loadavg)"
c0=$(cpu_ticks)
# Failed requests (an overloaded modelled cluster at time_scale 1 cannot drain in time) do not
# stop the script: the figures below are about the emulator, not the modelled GPUs.
"$bin/kvf-engine-load" --targets "$targets" --trace "$trace" --rate "$rate" \
  --duration_s "$duration" --drain_timeout_s "${DRAIN_S:-300}" | tee "$dir/load.txt" || true
c1=$(cpu_ticks)
echo "engines' CPU during the run: $(echo "scale=1; ($c1 - $c0) * 100 / $hz" | bc) core-% x s total"
echo "load after run: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 0 $((n - 1))); do
  curl -s "127.0.0.1:$((18100 + i))/metrics" > "$dir/m$i.txt"
  awk -v e="e$i" -v scale="$scale" '
    /^kvfabric_engine_step_lateness_p99_seconds/ {p99=$2}
    /^kvfabric_engine_steps_total/ {steps=$2}
    /^kvfabric_engine_step_duration_seconds_sum/ {ds=$2}
    /^kvfabric_engine_step_duration_seconds_count/ {dc=$2}
    /^vllm:prefix_cache_hits_total/ {hits=$2}
    /^vllm:prefix_cache_queries_total/ {q=$2}
    /^vllm:num_preemptions_total/ {pre=$2}
    END {w=(dc>0?ds/dc/scale:0);
         printf "%s steps=%d mean_step_wall_ms=%.2f lateness_p99_ms=%.3f p99/mean_step=%.2f%% hit_rate=%.2f preemptions=%d\n",
         e, steps, w*1000, p99*1000, (w>0?p99/w*100:0), (q>0?hits/q:0), pre}' "$dir/m$i.txt"
done
echo "logs and metrics: $dir"
