#!/usr/bin/env bash
# Router overhead against a direct connection and against nginx (Debian package) as a plain
# keep-alive reverse proxy: one emulated engine (time compressed so its modelled step is tens
# of microseconds), kvf-router (hybrid policy, KV events on) and nginx in front of it, and
# kvf-proxy-bench sending token-id completions at a fixed rate to each in turn.
# Usage: experiments/bench/proxy_overhead.sh [rate=200] [rounds=5] [phase_s=3]
# Writes experiments/results/proxy-overhead/{1k,100k}.json and prints the tables.
# Environment: KVF_PROXY_TOKENS (default "1000 100000"); KVF_PROXY_ROUTER_EXTRA: YAML lines
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
"$bin/kvf-engine" --config engine/configs/engine.yaml --port "$engine" --instance_id e0 \
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
policy: {kind: hybrid}
$2
YAML
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
