#!/usr/bin/env bash
# Same-run A/B of arcache binaries on the FLUSH-heavy job of issue 5:
# 4K random writes at QD16 with a FLUSH after each (fio --fsync=1) against
# arcache with a 1 GiB intent log, in front of the slow origin of
# bench/write-path.sh. The binaries take turns, so a machine whose speed
# drifts during the run treats them alike.
#
# Usage: bench/ab-flush.sh SECONDS ROUNDS BINARY...
#   ARCACHE_EXTRA="--set NAME=VALUE" adds serve options to every run.
# Prints one line per run: binary, IOPS, FLUSHes, log commits, us per commit.
set -euo pipefail
secs=${1:?seconds}; rounds=${2:?rounds}; shift 2
[ $# -ge 1 ] || { echo "usage: $0 SECONDS ROUNDS BINARY..." >&2; exit 2; }
for t in fio nbdkit python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (apt-get install fio nbdkit)" >&2; exit 2; }
done
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_start arcache-ab

nbdkit --foreground --exit-with-parent -U "$work/origin.sock" --filter=delay --filter=rate \
  memory 2G rdelay=4ms wdelay=4ms rate=2400M & pids+=($!)
wait_sock "$work/origin.sock"
for _ in $(seq "$rounds"); do
  for bin in "$@"; do
    rm -f "$work/nbd.sock" "$work/ctl.sock" "$work/log.img"
    # shellcheck disable=SC2086
    "$bin" serve --export "nbd+unix:///?socket=$work/origin.sock" --arc-max 256M \
      --listen "unix:$work/nbd.sock" --control "$work/ctl.sock" --log "$work/log.img:1G" \
      ${ARCACHE_EXTRA:-} >>"$work/serve.log" 2>&1 & arc=$!
    wait_sock "$work/nbd.sock"; wait_sock "$work/ctl.sock"
    timeout $((secs + 60)) fio --name=ab --ioengine=nbd --uri="nbd+unix:///?socket=$work/nbd.sock" \
      --rw=randwrite --bs=4k --size=512M --iodepth=16 --fsync=1 --time_based --runtime="$secs" \
      --randseed=7 --output-format=json --output="$work/ab.json" >/dev/null 2>&1 || echo "fio failed" >&2
    iops=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["write"]["iops"]))' "$work/ab.json")
    stats=$("$bin" stat --json --control "$work/ctl.sock" | python3 -c \
      'import json,sys; j=json.load(sys.stdin); print(j["zil_commit_count"], "FLUSHes,", j["zil_commit_writer_count"], "log commits,", j["zil_commit_us"], "us each")')
    echo "$bin $iops IOPS ($stats)"
    kill "$arc"; wait "$arc" || true
  done
done
