#!/usr/bin/env bash
# Router overhead against a direct connection and against nginx (Debian package) as a plain
# keep-alive reverse proxy: one emulated engine (time compressed so its modelled step is tens
# of microseconds), kvf-router (hybrid policy, KV events on) and nginx in front of it, and
# kvf-proxy-bench sending token-id completions at a fixed rate to each in turn.
# Usage: experiments/bench/proxy_overhead.sh [rate=200] [rounds=5] [phase_s=3]
# Writes experiments/results/proxy-overhead/{1k,100k,peak}.json and prints the tables.
# Environment: KVF_PROXY_TOKENS (default "1000 100000"); KVF_PROXY_INSTANCES=N (default 1):
# the router routes among N instances that all point at the one engine; KVF_PROXY_PEAK_RATE
# (default 1500 requests/s; 0 skips) and KVF_PROXY_PEAK_ROUNDS (default 4): the peak rate per
# core, router against nginx, measured at the end as answered requests per CPU second; KVF_PROXY_ROUTER_EXTRA: YAML lines
# appended to the router's config (e.g. "server: {busy_poll_us: 0}"); KVF_PROXY_BASE_ROUTER:
# a second kvf-router binary (e.g. main's, copied aside) added as target router_base in the
# same rotation, for before/after comparisons, with KVF_PROXY_BASE_EXTRA as its extra YAML.
# Each router's CPU time (user + system, from /proc) over the run is printed at the end; it
# includes the KV events of every target's requests (each router subscribes to the engine).

# -h/--help prints the comment above; any other flag is a usage error (exit 2).
case "${1:-}" in
  -h|--help) sed -n '2,/^$/{/^$/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  -*) echo "$0: unknown flag '$1' (see $0 --help)" >&2; exit 2 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/../.."
rate=${1:-200}; rounds=${2:-5}; phase=${3:-3}
bin=${KVF_BIN_DIR:-build/bin}
out=${KVF_PROXY_OUT:-experiments/results/proxy-overhead}
dir=$(mktemp -d /tmp/kvf_proxy_overhead.XXXXXX)
mkdir -p "$out" "$dir/nginx"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$1$2" > /dev/null && return 0; sleep 0.05; done
  echo "proxy_overhead: nothing answers on port $1$2 (logs in $dir)" >&2; exit 1
}
engine=$(free_port); router=$(free_port); nginx=$(free_port); ev=$(free_port); rp=$(free_port)
base=${KVF_PROXY_BASE_ROUTER:-}; base_port=$(free_port)
# CPU seconds (user + system) of a process so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
# With many instances on one engine the router holds a connection per instance: lift the
# engine's per-client connection cap (the profile path is relative to the config file).
engine_cfg=engine/configs/engine.yaml
if [ "${KVF_PROXY_INSTANCES:-1}" -gt 1 ]; then
  sed "s|^profile: \.\./|profile: $PWD/engine/|" "$engine_cfg" > "$dir/engine.yaml"
  echo "max_connections_per_client: 0" >> "$dir/engine.yaml"
  engine_cfg=$dir/engine.yaml
fi
"$bin/kvf-engine" --config "$engine_cfg" --port "$engine" --instance_id e0 \
  --kv_events_endpoint "tcp://127.0.0.1:$ev" --kv_replay_endpoint "tcp://127.0.0.1:$rp" \
  --time_scale 1000 --log_level warn > "$dir/engine.log" 2>&1 &
pids+=($!)
wait_http "$engine" /health
router_yaml() {  # port extra_yaml
  cat <<YAML
listen: {host: 127.0.0.1, port: $1}
instances:
  - id: e0
    url: http://127.0.0.1:$engine
    kv_events: {endpoint: "tcp://127.0.0.1:$ev", replay_endpoint: "tcp://127.0.0.1:$rp"}
$(extra_instances)
policy: {kind: hybrid}
$2
YAML
}
# KVF_PROXY_INSTANCES=N (default 1): N-1 more instances behind the same engine URL, without KV
# events, so the router's policy decides among N instances (the prefix is cached only on e0);
# health checks then every 60 s so they do not load the engine.
extra_instances() {
  local n=${KVF_PROXY_INSTANCES:-1}
  for i in $(seq 1 $((n - 1))); do
    echo "  - {id: x$i, url: \"http://127.0.0.1:$engine\"}"
  done
  [ "$n" -gt 1 ] && echo "health: {interval_s: 60}"
  return 0
}
# start_router NAME BINARY PORT EXTRA_YAML: starts it, waits for /health, sets started_pid.
start_router() {
  router_yaml "$3" "$4" > "$dir/$1.yaml"
  "$2" --config "$dir/$1.yaml" --log_level warn > "$dir/$1.log" 2>&1 &
  started_pid=$!
  pids+=($started_pid)
  wait_http "$3" /health
}
start_router router "$bin/kvf-router" "$router" "${KVF_PROXY_ROUTER_EXTRA:-}"
router_pid=$started_pid
targets="direct=127.0.0.1:$engine,router=127.0.0.1:$router"
if [ -n "$base" ]; then
  start_router router_base "$base" "$base_port" "${KVF_PROXY_BASE_EXTRA:-}"
  base_pid=$started_pid
  targets="$targets,router_base=127.0.0.1:$base_port"
fi
# A plain reverse proxy: one worker (the router uses one thread), HTTP/1.1 keep-alive to the
# upstream, default buffering, bodies up to 64 MiB.
cat > "$dir/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $dir/nginx/body;
  proxy_temp_path $dir/nginx/proxy;
  fastcgi_temp_path $dir/nginx/fastcgi;
  uwsgi_temp_path $dir/nginx/uwsgi;
  scgi_temp_path $dir/nginx/scgi;
  client_max_body_size 64m;
  client_body_buffer_size 4m;
  upstream engine { server 127.0.0.1:$engine; keepalive 64; }
  server {
    listen 127.0.0.1:$nginx;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
NGINX
/usr/sbin/nginx -e "$dir/nginx/error.log" -p "$dir/nginx" -c "$dir/nginx.conf" &
pids+=($!)
wait_http "$nginx" /health
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%H:%M:%S) UTC"
cpu_router0=$(cpu_s "$router_pid"); [ -n "$base" ] && cpu_base0=$(cpu_s "$base_pid")
for tokens in ${KVF_PROXY_TOKENS:-1000 100000}; do
  name=$([ "$tokens" = 1000 ] && echo 1k || echo 100k)
  "$bin/kvf-proxy-bench" --targets "$targets,nginx=127.0.0.1:$nginx" \
    --rate "$rate" --prompt_tokens "$tokens" --rounds "$rounds" --phase_s "$phase" \
    --json_out "$out/$name.json" | tee "$out/$name.md"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%H:%M:%S) UTC"
echo "router CPU over the run: $(awk -v a="$cpu_router0" -v b="$(cpu_s "$router_pid")" 'BEGIN { printf "%.2f s", b - a }')"
if [ -n "$base" ]; then
  echo "router_base CPU over the run: $(awk -v a="$cpu_base0" -v b="$(cpu_s "$base_pid")" 'BEGIN { printf "%.2f s", b - a }')"
fi
# Peak rate per core: router and nginx in turn (alternating, KVF_PROXY_PEAK_ROUNDS rounds),
# each sent 1k-token completions at KVF_PROXY_PEAK_RATE requests/s (default 1500, above what
# one proxy core sustains here beside the engine and the client), the proxy's own CPU seconds
# read from /proc around each phase: answered requests / CPU seconds is the rate one core of it
# serves. KVF_PROXY_PEAK_RATE=0 skips it.
peak_rate=${KVF_PROXY_PEAK_RATE:-1500}
if [ "$peak_rate" != 0 ]; then
  nginx_worker=$(pgrep -P "$(cat "$dir/nginx/nginx.pid")" | head -1)
  echo
  echo "## Peak rate per core (1k tokens, offered $peak_rate requests/s)"
  echo
  echo "| round | target | answered | errors | answered/s | CPU s | requests per CPU s |"
  echo "|---|---|---|---|---|---|---|"
  : > "$dir/peak.tsv"
  for round in $(seq "${KVF_PROXY_PEAK_ROUNDS:-4}"); do
    for t in router nginx; do
      if [ "$t" = router ]; then pid=$router_pid; port=$router; else pid=$nginx_worker; port=$nginx; fi
      c0=$(cpu_s "$pid")
      "$bin/kvf-proxy-bench" --targets "$t=127.0.0.1:$port" --rate "$peak_rate" \
        --prompt_tokens 1000 --rounds 1 --phase_s "$phase" --warmup_s 0 \
        --json_out "$dir/peak.json" > /dev/null 2>&1
      c1=$(cpu_s "$pid")
      /usr/bin/python3 - "$dir/peak.json" "$c0" "$c1" "$phase" "$round" "$t" >> "$dir/peak.tsv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["targets"][0]
cpu = float(sys.argv[3]) - float(sys.argv[2])
print(f"{sys.argv[5]}\t{sys.argv[6]}\t{r['requests']}\t{r['errors']}\t{r['requests']/float(sys.argv[4]):.0f}\t{cpu:.2f}\t{r['requests']/cpu if cpu > 0 else 0:.0f}")
PY
      tail -1 "$dir/peak.tsv" | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }'
    done
  done
  /usr/bin/python3 - "$dir/peak.tsv" "$out/peak.json" <<'PY'
import json, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
per = {}
for rnd, t, *_, rate in rows:
    per.setdefault(int(rnd), {})[t] = float(rate)
ratios = [v["router"] / v["nginx"] for v in per.values() if v.get("nginx")]
mean = statistics.mean(ratios)
half = 0.0
if len(ratios) > 1:
    t95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36}.get(len(ratios), 2.0)
    half = t95 * statistics.stdev(ratios) / len(ratios) ** 0.5
print(f"\nrouter / nginx requests per CPU second: {mean:.2f} +- {half:.2f} (95%, {len(ratios)} rounds)")
json.dump({"rows": rows, "ratio_mean": mean, "ratio_ci95": half}, open(sys.argv[2], "w"))
PY
fi
