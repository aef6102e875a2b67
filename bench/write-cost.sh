#!/usr/bin/env bash
# What durable L2 invalidation costs writes: 4K random writes at QD16 for
# 10 s over a 256 MiB export whose records are partly on L2 (one read pass
# first), with the L2 not persistent (l2arc_rebuild_blocks_min_l2size=1T
# keeps a 1 GiB device from logging) and persistent. Same run, same data;
# the two take turns for ROUNDS rounds, since whichever runs first on this
# machine can come out ahead by more than the difference being measured.
#
# Usage: bench/write-cost.sh [ROUNDS]   (default 2; about 30 s a round; needs fio, nbdcopy)
# Writes bench/results/write-cost.md (commit and date on its first line).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
for t in fio nbdcopy python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (apt-get install fio libnbd-bin)" >&2; exit 2; }
done
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
rounds=${1:-2}
result=$(bench_results write-cost.md)
header=$(bench_header "$rounds")
cargo build --release --quiet --manifest-path "$here/Cargo.toml"
bin="$here/target/release/arcache"
bench_start arcache-wcost
head -c 256M /dev/urandom > "$work/backing.img"

run() { # label min-l2size row-file
  rm -f "$work/l2.img" "$work/nbd.sock" "$work/ctl.sock"
  "$bin" serve --export "$work/backing.img" --arc-max 32M --l2 "$work/l2.img:1G" \
    --listen "unix:$work/nbd.sock" --control "$work/ctl.sock" \
    --set l2arc_feed_min_ms=10 --set l2arc_rebuild_blocks_min_l2size="$2" >>"$work/serve.log" 2>&1 &
  local arc=$!; pids+=("$arc")
  wait_sock "$work/nbd.sock"; wait_sock "$work/ctl.sock"
  nbdcopy "nbd+unix:///?socket=$work/nbd.sock" null:
  # Time for the feed to put what the pass left in the ARC's tails on L2.
  sleep 5
  "$bin" stat --json --control "$work/ctl.sock" > "$work/before.json"
  fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$work/nbd.sock" --rw=randwrite --bs=4k \
    --size=256M --iodepth=16 --time_based --runtime=10 --randseed=7 \
    --output-format=json --output="$work/w.json" >/dev/null 2>&1
  "$bin" stat --json --control "$work/ctl.sock" > "$work/after.json"
  kill "$arc"; wait "$arc" || true
  python3 - "$1" "$work/w.json" "$work/before.json" "$work/after.json" >> "$3" <<'PY'
import json, sys
label, w, b, a = sys.argv[1:]
j = json.load(open(w))["jobs"][0]["write"]
b, a = json.load(open(b)), json.load(open(a))
d = lambda k: a[k] - b[k]
print(f"| {label} | {b['l2_records']:,} | {j['iops']:,.0f} | {j['clat_ns']['mean'] / 1e6:.2f} ms "
      f"| {d('l2_log_commits'):,} | {d('l2_invalidated'):,} |")
PY
}

for r in $(seq "$rounds"); do
  run "not persistent (l2arc_rebuild_blocks_min_l2size=1T), round $r" 1T "$work/row-np"
  run "persistent, round $r" 0 "$work/row-p"
done
{
  echo "$header"
  echo
  echo "256 MiB export of random bytes, --arc-max 32M --l2 FILE:1G, one nbdcopy read pass, then"
  echo "fio --ioengine=nbd --rw=randwrite --bs=4k --iodepth=16 --runtime=10 --randseed=7 (no FLUSH)."
  echo
  echo "| L2 | records on L2 before | write IOPS | mean latency | L2 log commits | L2 records invalidated |"
  echo "|---|---|---|---|---|---|"
  cat "$work/row-np" "$work/row-p"
  python3 - "$work/row-np" "$work/row-p" <<'PY'
import sys
mean = [sum(v) / len(v) for v in
        ([float(l.split("|")[3].replace(",", "")) for l in open(f)] for f in sys.argv[1:])]
print(f"\nmean write IOPS: not persistent {mean[0]:,.0f}, persistent {mean[1]:,.0f}; "
      f"persistent / not persistent = {mean[1] / mean[0]:.2f}x")
PY
} | tee "$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
