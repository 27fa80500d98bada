#!/usr/bin/env bash
# The disk tier's bandwidth against fio on the same file system, block size and queue depth, in
# one run: rounds alternate fio (io_uring engine, O_DIRECT when the tier uses it) and
# kvf-tier-bench --mode=disk, writing then reading the same number of bytes, and the script
# prints each side's mean GB/s and the tier/fio ratio with 95% intervals over the rounds.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: tier_bench.sh [--dir DIR] [--block-kib N] [--qd N] [--mib N] [--rounds N]
                     [--read-order sequential|random]
  --dir DIR         folder on the file system to measure (default: a new folder under /tmp);
                    it is emptied and removed afterwards
  --block-kib N     block payload in KiB, also fio's block size (default 1024)
  --qd N            I/Os in flight, for both (default 16)
  --mib N           MiB written and then read per round (default 1024)
  --rounds N        alternating fio / tier rounds (default 5)
  --read-order O    sequential (fio rw=read) or random (fio rw=randread) (default sequential)
Environment: KVF_BIN_DIR (default build/bin) holds kvf-tier-bench.
EOF
}

cd "$(dirname "$0")/../.."
dir="" block_kib=1024 qd=16 mib=1024 rounds=5 order=sequential
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dir) dir=$2; shift 2 ;;
    --block-kib) block_kib=$2; shift 2 ;;
    --qd) qd=$2; shift 2 ;;
    --mib) mib=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --read-order) order=$2; shift 2 ;;
    *) echo "tier_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $order == sequential || $order == random ]] || { echo "tier_bench.sh: bad --read-order" >&2; exit 2; }
bin=${KVF_BIN_DIR:-build/bin}
command -v fio >/dev/null || { echo "tier_bench.sh: fio is not installed (scripts/setup)" >&2; exit 1; }
[[ -x $bin/kvf-tier-bench ]] || { echo "tier_bench.sh: $bin/kvf-tier-bench not built" >&2; exit 1; }
if [[ -z $dir ]]; then dir=$(mktemp -d /tmp/kvf_tier_bench.XXXXXX); fi
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir"

fio_read=read; [[ $order == random ]] && fio_read=randread
results=$(mktemp)
for r in $(seq "$rounds"); do
  tier=$("$bin/kvf-tier-bench" --mode=disk --dir="$dir/tier" --block_kib="$block_kib" --qd="$qd" \
    --disk_mib="$mib" --read_order="$order" --repeats=1 --json | grep '^{')
  direct=$(echo "$tier" | /usr/bin/python3 -c 'import json,sys; print(1 if json.load(sys.stdin)["direct_io"] else 0)')
  for rw in write "$fio_read"; do
    # fio counts every byte it moves; the tier's figure counts payload only (its 4 KiB slot header
    # per block is extra I/O the tier does and does not count).
    fio --name=kvf --directory="$dir" --filename=fio.dat --rw="$rw" --bs="${block_kib}k" \
      --iodepth="$qd" --ioengine=io_uring --direct="$direct" --size="${mib}m" \
      --output-format=json >"$dir/fio.json"
    /usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = "write" if sys.argv[2] == "write" else "read"
print("fio", side, j[side]["bw_bytes"] / 1e9)' "$dir/fio.json" "$rw" >>"$results"
  done
  rm -f "$dir/fio.dat"
  echo "$tier" | /usr/bin/python3 -c '
import json, sys
t = json.load(sys.stdin)
print("tier write", t["write_gbs"]); print("tier read", t["read_gbs"])' >>"$results"
done

/usr/bin/python3 - "$results" "$block_kib" "$qd" "$mib" "$order" "$rounds" <<'EOF'
import math, statistics, sys
path, block_kib, qd, mib, order, rounds = sys.argv[1:]
rows = [line.split() for line in open(path)]
def series(who, side):
    return [float(v) for w, s, v in rows if w == who and s == side]
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]
def interval(xs):
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, 0.0
    t = T95[len(xs) - 2] if len(xs) - 2 < len(T95) else 1.96
    return m, t * statistics.stdev(xs) / math.sqrt(len(xs))
print(f"disk tier vs fio: {block_kib} KiB blocks, qd {qd}, {mib} MiB per direction, "
      f"{order} reads, {rounds} rounds")
print("| direction | tier GB/s | fio GB/s | tier / fio |")
print("|---|---|---|---|")
for side in ("write", "read"):
    tier, fio = series("tier", side), series("fio", side)
    ratio = [a / b for a, b in zip(tier, fio)]
    fmt = lambda i, d: f"{i[0]:.{d}f} ± {i[1]:.{d}f}"
    print(f"| {side} | {fmt(interval(tier), 3)} | {fmt(interval(fio), 3)} | {fmt(interval(ratio), 2)} |")
EOF
rm -f "$results"
