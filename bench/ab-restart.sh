#!/usr/bin/env bash
# Same-run A/B of arcache builds on the first seconds after a restart:
# the persistent L2 rebuilt from its log, the ARC empty, so nearly every
# 4K random read at QD16 is an L2 read that also inserts a record (the
# phase bench/l2arc.sh's "warm restart" measures once, against nbdkit).
#
# One L2 file is warmed once by the first arm (1 GiB of a slow origin,
# nbdkit file + delay 4 ms + rate 2400M, read whole through --arc-max
# 256M --l2 FILE:4G until the feed stops growing L2); then each round
# restarts every arm in turn on that same file, waits for its rebuild, and
# times fio for SECONDS, the arms in the given order in odd rounds and
# reversed in even ones. The arms share the file, so each finds the copies
# the others left.
#
# Usage: bench/ab-restart.sh SECONDS ROUNDS BINARY...
#   Name binaries of other commits by their commit (/var/tmp/arcache-4a45d3c).
# Writes bench/results/ab-restart.md, or ab-restart-$AB_NAME.md when AB_NAME
# is set (an existing named result is kept unless AB_OVERWRITE=1).
set -euo pipefail
secs=${1:?seconds}; rounds=${2:?rounds}; shift 2
[ $# -ge 1 ] || { echo "usage: $0 SECONDS ROUNDS BINARY..." >&2; exit 2; }
for t in fio nbdkit nbdcopy python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
result=$(bench_ab_results "ab-restart${AB_NAME:+-$AB_NAME}.md") || exit 2
header=$(bench_header "$secs" "$rounds" "${@@Q}")
bench_start arcache-ab-restart

head -c $((1 << 30)) /dev/urandom > "$work/origin.img"
nbdkit --foreground --exit-with-parent -U "$work/origin.sock" --filter=rate --filter=delay \
  file "$work/origin.img" rdelay=4ms rate=2400M & pids+=($!)
wait_sock "$work/origin.sock"

serve() { # binary
  rm -f "$work/nbd.sock" "$work/ctl.sock"
  "$1" serve --listen "unix:$work/nbd.sock" --control "$work/ctl.sock" --arc-max 256M \
    --export "nbd+unix:///?socket=$work/origin.sock" --l2 "$work/l2.img:4G" 2>>"$work/serve.log" &
  arc=$!
  pids+=("$arc")
  wait_sock "$work/nbd.sock"; wait_sock "$work/ctl.sock"
}
stat_of() { # binary key
  "$1" stat --json --control "$work/ctl.sock" | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"
}
stop() { kill -TERM "$arc"; wait "$arc" || true; }

serve "$1"
nbdcopy "nbd+unix:///?socket=$work/nbd.sock" null:
prev=-1 settled=0
for _ in $(seq 90); do
  now=$(stat_of "$1" l2_size)
  [ "$now" = "$prev" ] && { settled=1; break; }
  prev=$now; sleep 2
done
stop
[ $settled = 1 ] || { echo "bench: the feed was still growing L2 after 180 s" >&2; exit 1; }
echo "bench: L2 warmed, $prev bytes" >&2

for round in $(seq "$rounds"); do
  # Odd rounds in the order given, even rounds reversed: the arm that runs
  # second reads blocks the first just read (any cache below O_DIRECT
  # favours it), so each arm runs second as often as first.
  order=("$@")
  if [ $((round % 2)) = 0 ]; then
    order=(); for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done
  fi
  for bin in "${order[@]}"; do
    serve "$bin"
    rebuilt=0
    for _ in $(seq 200); do
      [ "$(stat_of "$bin" l2_rebuild_success)" = 1 ] && { rebuilt=1; break; }
      sleep 0.05
    done
    [ $rebuilt = 1 ] || { echo "bench: $bin did not rebuild its L2 within 10 s" >&2; exit 1; }
    rm -f "$work/fio.json"
    timeout $((secs + 60)) fio --name=restart --ioengine=nbd --uri="nbd+unix:///?socket=$work/nbd.sock" \
      --rw=randread --bs=4k --size=1G --iodepth=16 --runtime="$secs" --time_based --randseed="$round" \
      --output-format=json --output="$work/fio.json" >/dev/null 2>&1 || { echo "bench: fio failed on $bin" >&2; exit 1; }
    iops=$(python3 -c "import json; print(round(json.load(open('$work/fio.json'))['jobs'][0]['read']['iops']))")
    hits=$(stat_of "$bin" l2_hits)
    printf '%s\t%s\t%s\t%s\n' "$round" "$bin" "$iops" "$hits" | tee -a "$work/runs.tsv" >&2
    stop
  done
done

{
  echo "$header"
  echo
  echo "job: 1 GiB origin (nbdkit file, delay rdelay=4ms, rate 2400M); arcache --arc-max 256M --l2 FILE:4G, the L2 warmed once ($prev bytes) by the first arm; each run a restart on that file, the rebuild awaited, then fio --ioengine=nbd --rw=randread --bs=4k --size=1G --iodepth=16 --runtime=$secs --randseed=ROUND; arms take turns, in the given order in odd rounds and reversed in even ones, $rounds rounds"
  bench_arms "$@"
  echo
  python3 - "$work/runs.tsv" "$@" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print("| arm | binary | IOPS per round | median IOPS | L2 hits in the timed run (median) |")
print("|---|---|---|---:|---:|")
for i, b in enumerate(sys.argv[2:], 1):
    mine = [r for r in rows if r[1] == b]
    iops = [int(r[2]) for r in mine]
    hits = [int(r[3]) for r in mine]
    print(f"| {i} | `{b}` | {' / '.join(f'{x:,}' for x in iops)} | {statistics.median(iops):,.0f} | {statistics.median(hits):,.0f} |")
PY
} > "$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
cat "$result"
