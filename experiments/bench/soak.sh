#!/usr/bin/env bash
# Soak: a small cluster under steady load for a long time while the RSS and open file
# descriptors of the router and every engine are sampled; at the end each process's change from
# the end of warm-up to the end is judged against a 5% bound (docs/benchmarks.md, "Soak").
set -euo pipefail

usage() {
  cat <<'EOF'
experiments/bench/soak.sh: starts emulated engines with KV-push workers (kvf-engine) and a
router (kvf-router) in front of them on 127.0.0.1 ports it picks, drives steady load through
the router for --duration seconds, and samples every --interval seconds the RSS (VmRSS of
/proc/PID/status) and the open file descriptors (/proc/PID/fd) of the router and each engine.
At the end it prints, per process, the mean of the first minute after --warmup against the
mean of the last minute (and the maximum after warm-up), PASS when the end is within --bound
of the start, and draws both series against time.

Load (all through the router):
  - kvf-replay over data/traces/mooncake/conversation_trace.jsonl (streaming requests), in a
    loop with a new token salt each pass so fresh prefixes keep arriving, its arrivals sent
    --replay_scale times faster than the trace;
  - a curl loop at --extra_rps requests per second: non-streaming completions over a few
    shared prefixes, and every third request a client that disconnects early (a streaming one
    after 0.3 s, or a non-streaming one after 50 ms).
The engines' modelled clocks run --time_scale times faster than the wall clock. The printed
busy fraction is each engine's modelled step time (kvfabric_engine_step_duration_seconds_sum)
over the modelled time elapsed. By the harness's definition (docs/experiments.md, "Load as
offered utilisation") the defaults offer 0.57 of 4 engines' capacity over the 1440 s of trace a
30-minute run replays (0.55 over the whole trace), plus the curl loop's short requests.

Usage: experiments/bench/soak.sh [flags]
  --duration S       seconds of load (default 1800)
  --warmup S         seconds before the first judged sample (default 300)
  --interval S       seconds between samples (default 10)
  --bound PCT        allowed change in percent (default 5)
  --engines N        emulated engines, 1-16 (default 4)
  --policy KIND      router policy: unified (moves KV, default), elastic, hybrid, lmetric, ...
  --time_scale X     engines' time compression (default 4)
  --replay_scale X   kvf-replay --time_scale (default 0.8: offered utilisation 0.57 at the
                     defaults; it scales with replay_scale / (engines x time_scale))
  --extra_rps R      curl requests per second, 0 = none (default 2)
  --output_dir DIR   where the CSV, plot, logs and summary go
                     (default experiments/results/soak-<UTC time>)
  -h, --help         this text
Environment: KVF_BIN_DIR (default build/bin).
After the load it stops the clients, waits (at most 120 s) until the engines hold no request,
then 35 s more (pooled idle connections close after 30 s), and compares each process's idle
RSS and fds with its idle figures from before the load.
Output: DIR/samples.csv (t_s,process,pid,rss_kb,fds), DIR/soak.png, DIR/summary.txt (the
verdict), DIR/idle.csv and idle.txt (before and after), DIR/utilisation.txt (busy fraction,
client aborts, kvf-replay's TTFT), DIR/router.yaml, DIR/*.log, DIR/replay-*.jsonl.
Needs /usr/bin/python3 with numpy and matplotlib.
Exit status: 0 every process within the bound, 1 one is not or the cluster failed, 2 a bad
command line.
EOF
}

die_usage() { echo "soak.sh: $1 (see experiments/bench/soak.sh --help)" >&2; exit 2; }
is_num() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
is_int() { [[ $1 =~ ^[0-9]+$ ]]; }

duration=1800 warmup=300 interval=10 bound=5 engines=4 policy=unified
time_scale=4 replay_scale=0.8 extra_rps=2 out=""
while [[ $# -gt 0 ]]; do
  flag=$1 value=""
  case "$flag" in
    -h|--help) usage; exit 0 ;;
    --*=*) value=${flag#*=}; flag=${flag%%=*} ;;
    --*) [[ $# -ge 2 ]] || die_usage "$flag needs a value"; value=$2; shift ;;
    *) die_usage "unexpected argument '$flag'" ;;
  esac
  case "$flag" in
    --duration) is_int "$value" && ((value > 0)) || die_usage "--duration must be a positive integer, got '$value'"; duration=$value ;;
    --warmup) is_int "$value" || die_usage "--warmup must be a whole number of seconds, got '$value'"; warmup=$value ;;
    --interval) is_int "$value" && ((value > 0)) || die_usage "--interval must be a positive integer, got '$value'"; interval=$value ;;
    --bound) is_num "$value" || die_usage "--bound must be a number, got '$value'"; bound=$value ;;
    --engines) is_int "$value" && ((value >= 1 && value <= 16)) || die_usage "--engines must be 1-16, got '$value'"; engines=$value ;;
    --policy) [[ $value =~ ^[a-z_]+$ ]] || die_usage "--policy must be a policy kind, got '$value'"; policy=$value ;;
    --time_scale) is_num "$value" || die_usage "--time_scale must be a positive number, got '$value'"; time_scale=$value ;;
    --replay_scale) is_num "$value" || die_usage "--replay_scale must be a positive number, got '$value'"; replay_scale=$value ;;
    --extra_rps) is_num "$value" || die_usage "--extra_rps must be a number, got '$value'"; extra_rps=$value ;;
    --output_dir) [[ -n $value ]] || die_usage "--output_dir needs a value"; out=$value ;;
    *) die_usage "unknown flag '$flag'" ;;
  esac
  shift
done
((warmup + 60 <= duration)) || die_usage "--warmup ($warmup) leaves less than a minute of --duration ($duration)"
((interval <= 60)) || die_usage "--interval must be at most 60 so each judged minute has a sample"

cd "$(dirname "$0")/../.."
bin=${KVF_BIN_DIR:-build/bin}
trace=data/traces/mooncake/conversation_trace.jsonl
py=/usr/bin/python3
for b in kvf-engine kvf-router kvf-replay; do
  [[ -x $bin/$b ]] || { echo "soak.sh: $bin/$b is missing (scripts/build)" >&2; exit 1; }
done
command -v curl > /dev/null || { echo "soak.sh: curl is missing" >&2; exit 1; }
out=${out:-experiments/results/soak-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# Everything started here is killed on exit: the servers by pid, the load loops with their
# children (each loop runs in its own process group).
server_pids=() loop_pids=()
cleanup() {
  local p
  for p in "${loop_pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  for p in "${server_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # A server that has not stopped 10 s after SIGTERM is killed.
  local deadline=$((SECONDS + 10))
  for p in "${server_pids[@]}"; do
    while kill -0 "$p" 2>/dev/null && [[ $(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null) != Z ]] &&
      ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  for p in "${loop_pids[@]}" "${server_pids[@]}"; do wait "$p" || true; done
} 2>/dev/null  # also the shell's "Terminated" job notices
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
set -m  # background jobs get their own process groups

# Free ports, held together while they are picked so they differ.
read -r -a ports <<< "$("$py" - "$((engines * 4 + 1))" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)"
export KVF_WORKER_TOKEN
KVF_WORKER_TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')

wait_ready() {  # file, pid, name
  local deadline=$((SECONDS + 60))
  until [[ -s $1 ]]; do
    kill -0 "$2" 2>/dev/null || { echo "soak.sh: $3 exited while starting (log: $out/$3.log)" >&2; exit 1; }
    ((SECONDS < deadline)) || { echo "soak.sh: $3 not ready after 60 s (log: $out/$3.log)" >&2; exit 1; }
    sleep 0.1
  done
}

router_port=${ports[0]}
{
  echo "listen: {host: 127.0.0.1, port: $router_port}"
  echo "instances:"
} > "$out/router.yaml"
names=(router)
for ((i = 0; i < engines; i++)); do
  http=${ports[$((1 + 4 * i))]} ev=${ports[$((2 + 4 * i))]}
  rep=${ports[$((3 + 4 * i))]} wk=${ports[$((4 + 4 * i))]}
  "$bin/kvf-engine" --config engine/configs/engine.yaml --instance_id "e$i" --port "$http" \
    --kv_events_endpoint "tcp://127.0.0.1:$ev" --kv_replay_endpoint "tcp://127.0.0.1:$rep" \
    --worker_port "$wk" --time_scale "$time_scale" --log_level warn \
    --ready_file "$out/e$i.ready" > "$out/e$i.log" 2>&1 &
  server_pids+=($!)
  names+=("e$i")
  cat >> "$out/router.yaml" <<EOF
  - {id: e$i, url: "http://127.0.0.1:$http", worker_url: "http://127.0.0.1:$wk",
     kv_events: {endpoint: "tcp://127.0.0.1:$ev", replay_endpoint: "tcp://127.0.0.1:$rep"}}
EOF
done
echo "policy: {kind: $policy}" >> "$out/router.yaml"
for ((i = 0; i < engines; i++)); do wait_ready "$out/e$i.ready" "${server_pids[$i]}" "e$i"; done
"$bin/kvf-router" --config "$out/router.yaml" --log_level warn --ready_file "$out/router.ready" \
  > "$out/router.log" 2>&1 &
router_pid=$!
server_pids+=("$router_pid")
wait_ready "$out/router.ready" "$router_pid" router
url=http://127.0.0.1:$router_port
deadline=$((SECONDS + 30))
until curl -sf "$url/health" > /dev/null; do
  ((SECONDS < deadline)) || { echo "soak.sh: router not healthy after 30 s" >&2; exit 1; }
  sleep 0.2
done
pids=("$router_pid" "${server_pids[@]:0:$engines}")
model=$(curl -s "$url/v1/models" | "$py" -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')

metric_sum() {  # url, metric name: the sum over its series, 0 when absent
  curl -s --max-time 5 "$1/metrics" | awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $NF } END { printf "%.6f", s + 0 }'
}
sample() {  # t, file: one row per process (t,process,pid,rss_kb,fds); fails if one is gone
  local k p rss fds
  for k in "${!pids[@]}"; do
    p=${pids[$k]}
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
    # No VmRSS: gone, or a zombie waiting to be reaped.
    [[ -n $rss ]] || { echo "soak.sh: ${names[$k]} (pid $p) died at t=$1 s (log: $out/${names[$k]}.log)" >&2; return 1; }
    fds=$(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    echo "$1,${names[$k]},$p,$rss,$fds" >> "$2"
  done
}
# Idle figures before any load, compared at the end with the same after the load has drained:
# descriptors or memory still held then are not explained by requests in flight.
echo "t_s,process,pid,rss_kb,fds" > "$out/idle.csv"
sample before "$out/idle.csv"

# Load 1: the Mooncake conversation trace, streaming, looped with a new salt each pass.
(
  pass=0
  while :; do
    pass=$((pass + 1))
    "$bin/kvf-replay" --trace "$trace" --url "$url" --time_scale "$replay_scale" \
      --salt "$pass" --timeout_s 300 --progress=false \
      --output "$out/replay-$pass.jsonl" >> "$out/replay.log" 2>&1 || true
  done
) &
loop_pids+=($!)

# Load 2: non-streaming requests over shared prefixes and clients that hang up early.
if [[ $extra_rps != 0 && $extra_rps != 0.0 ]]; then
  (
    gap=$(awk -v r="$extra_rps" 'BEGIN { printf "%.3f", 1 / r }')
    n=0
    while :; do
      n=$((n + 1))
      # 8 prefixes of 512 tokens, each with a 64-token tail of its own.
      prompt="$(seq -s, $((2000 + (n % 8) * 1000)) $((2511 + (n % 8) * 1000))),$(seq -s, $((20000 + n % 5000)) $((20063 + n % 5000)))"
      case $((n % 6)) in
        1) curl -s -o /dev/null --max-time 0.3 -N "$url/v1/completions" -H 'Content-Type: application/json' \
             -d "{\"model\":\"$model\",\"prompt\":[$prompt],\"max_tokens\":256,\"ignore_eos\":true,\"stream\":true}" ;;
        4) curl -s -o /dev/null --max-time 0.05 "$url/v1/completions" -H 'Content-Type: application/json' \
             -d "{\"model\":\"$model\",\"prompt\":[$prompt],\"max_tokens\":256,\"ignore_eos\":true}" ;;
        *) curl -s -o /dev/null --max-time 60 "$url/v1/completions" -H 'Content-Type: application/json' \
             -d "{\"model\":\"$model\",\"prompt\":[$prompt],\"max_tokens\":32}" ;;
      esac &
      sleep "$gap"
      # Reap finished curls so the loop itself holds no growing list of children.
      while (($(jobs -rp | wc -l) > 64)); do wait -n || true; done
    done
  ) &
  loop_pids+=($!)
fi

busy0=()
for ((i = 0; i < engines; i++)); do
  busy0+=("$(metric_sum "http://127.0.0.1:${ports[$((1 + 4 * i))]}" kvfabric_engine_step_duration_seconds_sum)")
done

csv=$out/samples.csv
echo "t_s,process,pid,rss_kb,fds" > "$csv"
echo "soak: ${engines} engines (workers on, time scale $time_scale) + router (policy $policy) on $url;" \
  "replay scale $replay_scale, extra $extra_rps req/s; ${duration} s, warm-up ${warmup} s, every ${interval} s -> $out"
start=$SECONDS next=0 last_report=-60
while :; do
  t=$((SECONDS - start))
  ((t >= next)) || { sleep 0.2; continue; }
  sample "$t" "$csv" || exit 1
  if ((t - last_report >= 60)); then
    last_report=$t
    reqs=$(metric_sum "$url" kvfabric_router_requests_total)
    line=$(printf 't=%5d s router requests %.0f |' "$t" "$reqs")
    for k in "${!pids[@]}"; do
      line+=$(awk -F, -v t="$t" -v p="${names[$k]}" '$1 == t && $2 == p { printf " %s %.1f MiB %d fds", p, $4 / 1024, $5 }' "$csv")
    done
    echo "$line"
  fi
  next=$((next + interval))
  ((t < duration)) || break
done

# Stop the load; the engines abort what their clients left, then sample idle again.
{
  for p in "${loop_pids[@]}"; do kill -TERM -- "-$p" || true; done
  for p in "${loop_pids[@]}"; do wait "$p" || true; done
} 2>/dev/null
loop_pids=()
deadline=$((SECONDS + 120))
while :; do
  busy=0
  for ((i = 0; i < engines; i++)); do
    e=http://127.0.0.1:${ports[$((1 + 4 * i))]}
    busy=$(awk -v x="$busy" -v y="$(metric_sum "$e" vllm:num_requests_running)" \
      -v z="$(metric_sum "$e" vllm:num_requests_waiting)" 'BEGIN { printf "%.0f", x + y + z }')
  done
  ((busy > 0 && SECONDS < deadline)) || break
  sleep 0.5
done
((busy == 0)) || echo "soak.sh: $busy requests still in the engines 120 s after the load stopped" >&2
sample drained "$out/idle.csv" || exit 1
# Pooled idle upstream connections close after 30 s (common/http_client.h, idle_ttl): a
# descriptor still open after that is held by something else.
sleep 35
sample after "$out/idle.csv" || exit 1
echo "idle, before the load -> 35 s after it drained (RSS MiB, open fds):"
awk -F, 'NR > 1 && $1 == "before" { r[$2] = $4; f[$2] = $5 }
  NR > 1 && $1 == "after" { printf "  %-7s %6.1f -> %6.1f MiB  %4d -> %4d fds\n", $2, r[$2] / 1024, $4 / 1024, f[$2], $5 }' \
  "$out/idle.csv" | tee "$out/idle.txt"
echo "load: router decisions by mode (since start):"
curl -s --max-time 5 "$url/metrics" | grep -E '^kvfabric_router_(decisions_total|requests_total)' | sed 's/^/  /' || true
{
  echo "engines' busy fraction (modelled time with a step running, decode at any batch included):"
  for ((i = 0; i < engines; i++)); do
    b1=$(metric_sum "http://127.0.0.1:${ports[$((1 + 4 * i))]}" kvfabric_engine_step_duration_seconds_sum)
    awk -v e="e$i" -v b0="${busy0[$i]}" -v b1="$b1" -v d="$duration" -v s="$time_scale" \
      'BEGIN { printf "  %s %.2f\n", e, (b1 - b0) / (d * s) }'
  done
  aborted=0
  for ((i = 0; i < engines; i++)); do
    a=$(metric_sum "http://127.0.0.1:${ports[$((1 + 4 * i))]}" kvfabric_engine_requests_aborted_total)
    aborted=$(awk -v x="$aborted" -v y="$a" 'BEGIN { printf "%.0f", x + y }')
  done
  echo "requests the engines aborted because the client went away: $aborted"
} | tee "$out/utilisation.txt"
"$py" - "$out" <<'PY' | tee -a "$out/utilisation.txt"
import glob, json, sys
import numpy as np
rows = []
for f in sorted(glob.glob(sys.argv[1] + "/replay-*.jsonl")):
    for line in open(f):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # the line kvf-replay was writing when it was stopped
ttft = np.array([r["ttft_s"] for r in rows if r["ok"]])
if len(ttft):
    print(f"kvf-replay: {len(rows)} requests finished, {len(rows) - len(ttft)} failed; TTFT "
          f"p50 {np.median(ttft):.2f} s, p99 {np.percentile(ttft, 99):.2f} s (wall clock)")
PY
cleanup
trap - EXIT
"$py" experiments/bench/soak_report.py "$csv" --warmup "$warmup" --bound "$bound" \
  --plot "$out/soak.png" | tee "$out/summary.txt"
exit "${PIPESTATUS[0]}"
