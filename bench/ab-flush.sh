#!/usr/bin/env bash
# Same-run A/B of arcache binaries on the FLUSH-heavy job of issue 5:
# 4K random writes at QD16 with a FLUSH after each (fio --fsync=1) against
# arcache with a 1 GiB intent log, in front of the slow origin of
# bench/write-path.sh. The binaries take turns, so a machine whose speed
# drifts during the run treats them alike.
#
# Usage: bench/ab-flush.sh SECONDS ROUNDS ARM...
#   An ARM is a binary, optionally followed (in the same word) by serve
#   options for it: "target/release/arcache --set zfs_vdev_sync_write_max_active=2".
#   The same binary twice is an A/A run: how far apart two arms land with
#   no difference at all, i.e. the noise any A/B here must clear.
#   ARCACHE_EXTRA="--set NAME=VALUE" adds serve options to every run.
#   Name binaries of other commits by their commit (/var/tmp/arcache-1bff93b):
#   the result file's header names only the commit of this tree, a
#   line per arm the commit its binary says it was built from.
# Prints one line per run: arm, IOPS, FLUSHes, log commits, us per commit,
# then each arm's runs and mean, and writes the same to
# bench/results/ab-flush.md, or ab-flush-$AB_NAME.md when AB_NAME is set.
# A named result that exists already is kept (the script stops first);
# AB_OVERWRITE=1 replaces it.
set -euo pipefail
secs=${1:?seconds}; rounds=${2:?rounds}; shift 2
[ $# -ge 1 ] || { echo "usage: $0 SECONDS ROUNDS ARM..." >&2; exit 2; }
for t in fio nbdkit python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (apt-get install fio nbdkit)" >&2; exit 2; }
done
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
result=$(bench_ab_results "ab-flush${AB_NAME:+-$AB_NAME}.md") || exit 2
header=$(bench_header "$secs" "$rounds" "${@@Q}")
bench_start arcache-ab

nbdkit --foreground --exit-with-parent -U "$work/origin.sock" --filter=delay --filter=rate \
  memory 2G rdelay=4ms wdelay=4ms rate=2400M & pids+=($!)
wait_sock "$work/origin.sock"
for _ in $(seq "$rounds"); do
  n=0
  for spec in "$@"; do
    n=$((n + 1))
    read -ra arm <<<"$spec"
    bin=${arm[0]}
    rm -f "$work/nbd.sock" "$work/ctl.sock" "$work/log.img"
    # shellcheck disable=SC2086
    "$bin" serve --export "nbd+unix:///?socket=$work/origin.sock" --arc-max 256M \
      --listen "unix:$work/nbd.sock" --control "$work/ctl.sock" --log "$work/log.img:1G" \
      "${arm[@]:1}" ${ARCACHE_EXTRA:-} >>"$work/serve.log" 2>&1 & arc=$!; pids+=("$arc")
    wait_sock "$work/nbd.sock"; wait_sock "$work/ctl.sock"
    timeout $((secs + 60)) fio --name=ab --ioengine=nbd --uri="nbd+unix:///?socket=$work/nbd.sock" \
      --rw=randwrite --bs=4k --size=512M --iodepth=16 --fsync=1 --time_based --runtime="$secs" \
      --randseed=7 --output-format=json --output="$work/ab.json" >/dev/null 2>&1 || echo "fio failed" >&2
    iops=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["write"]["iops"]))' "$work/ab.json")
    stats=$("$bin" stat --json --control "$work/ctl.sock" | python3 -c \
      'import json,sys; j=json.load(sys.stdin); print(j["zil_commit_count"], "FLUSHes,", j["zil_commit_writer_count"], "log commits,", j["zil_commit_us"], "us each")')
    echo "$spec $iops IOPS ($stats)"
    printf '%s\t%s\n' "$n" "$iops" >>"$work/runs.tsv"
    echo "| $n | $iops | $stats |" >>"$work/runs.md"
    kill "$arc"; wait "$arc" || true
  done
done
{
  echo "$header"
  echo
  echo "origin: nbdkit memory 2G + delay (rdelay=4ms wdelay=4ms) + rate (2400M); arcache --arc-max 256M --log FILE:1G${ARCACHE_EXTRA:+ $ARCACHE_EXTRA}"
  echo "fio --ioengine=nbd --rw=randwrite --bs=4k --iodepth=16 --fsync=1 --runtime=$secs --randseed=7; arms take turns, $rounds rounds"
  bench_arms "$@"
  echo
  echo "| arm | binary and options | IOPS per round | mean |"
  echo "|---|---|---|---|"
  python3 - "$work/runs.tsv" "$@" <<'PY'
import sys
runs = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
for n, spec in enumerate(sys.argv[2:], 1):
    v = [int(i) for a, i in runs if a == str(n)]
    print(f"| {n} | `{spec}` | {' / '.join(f'{i:,}' for i in v)} | {sum(v) / len(v):,.0f} |")
PY
  # The log's own latency moves from run to run on a shared disk; each
  # run's log IO per commit says how much of a difference it explains.
  echo
  echo "Each run, in the order run: arm, IOPS, and the server's zil counters."
  echo
  echo "| arm | IOPS | FLUSHes, log commits, log IO per commit |"
  echo "|---|---|---|"
  cat "$work/runs.md"
} | tee "$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
