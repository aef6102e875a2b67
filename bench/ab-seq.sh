#!/usr/bin/env bash
# Same-run A/B of arcache builds or settings on issue 21's sequential job:
# a 2 GiB object of random bytes in a one-node Ceph's RGW
# (tests/ceph/ceph-up.sh), read whole by nbdcopy through a fresh server
# (cold: every byte a ranged GET), then again through the same server
# (warm: from RAM and the L2 file). Each round also reads the object with
# `rclone cat` (one streaming GET), the peer of the issue's bar, so each
# arm's ratio to it is of the same round.
#
# The job is bound by CPU on two cores that the Ceph daemons share, so
# each arm's CPU seconds per GiB (the server's own, from /proc) are what a
# change to the read path moves; throughput follows from them, through
# the noise of the daemons.
#
# AB_ORIGIN=nbdkit runs the same passes over a 2 GiB local file of random
# bytes served by nbdkit (its rate filter set to 4000M bits/s), without
# Ceph or rclone: the server's CPU per GiB without the daemons' noise
# beside it. Its cold passes have run at 510-960 MB/s, often faster than
# the L2 feed writes, so the warm pass reads part of the file from the
# origin again: the result's column of what L2 held after the cold pass
# says how much, and the next, how many records the feed examined for each
# MiB it fed (`l2_feed_examined`; n/a for a build without that stat).
#
# AB_ORIGIN=ram: a 1 GiB local file (the page cache holds it) through
# --arc-max 2G and no L2: the cold pass fills the ARC, the warm pass is
# all ARC hits, answered on the connection's thread.
#
# AB_PIN=1 pins the server to core 0 and nbdcopy and nbdkit to core 1
# (taskset), so the arms' CPU seconds are not inflated by whatever else
# ran beside them on the same core (the Ceph daemons are not pinned).
#
# Usage: bench/ab-seq.sh ROUNDS ARM...
#   An ARM is a binary, optionally followed (in the same word) by serve
#   options: "target/release/arcache --recordsize 128K". Arms take turns.
#   Name binaries of other commits by their commit
#   (/var/tmp/arcache-2a1fb11): the header names only this tree's commit,
#   a line per arm the commit its binary says it was built from.
# Needs: ceph-mon ceph-osd radosgw, rclone, nbdcopy, the venv .ci/run makes
# (boto3); for AB_ORIGIN=nbdkit, nbdkit. Writes bench/results/ab-seq.md
# (ab-seq-nbdkit.md, ab-seq-ram.md), with -pinned after the origin for
# AB_PIN=1 and -$AB_NAME at the end when AB_NAME is set.
# A named result that exists already is kept (the script stops first);
# AB_OVERWRITE=1 replaces it.
set -euo pipefail
rounds=${1:?rounds}; shift
[ $# -ge 1 ] || { echo "usage: $0 ROUNDS ARM..." >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
py=${ARCACHE_MOTO_VENV:-/var/tmp/arcache-moto-venv}/bin/python
origin=${AB_ORIGIN:-s3}
case $origin in
  s3) needs=(nbdcopy rclone ceph-mon radosgw "$py") ;;
  nbdkit) needs=(nbdcopy nbdkit) ;;
  ram) needs=(nbdcopy) ;;
  *) echo "bench: AB_ORIGIN is s3, nbdkit or ram" >&2; exit 2 ;;
esac
for t in "${needs[@]}"; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing" >&2; exit 2; }
done
suffix=; [ "$origin" != s3 ] && suffix=-$origin
[ "${AB_PIN:-0}" = 1 ] && suffix+=-pinned
on_server=() on_client=()
if [ "${AB_PIN:-0}" = 1 ]; then
  on_server=(taskset -c 0) on_client=(taskset -c 1)
fi
result=$(bench_ab_results "ab-seq$suffix${AB_NAME:+-$AB_NAME}.md") || exit 2
header=$(bench_header "$rounds" "${@@Q}")
bench_start arcache-ab-seq
# The export's size in MiB and the cache each arm's server gets.
mib=2048 cache_args=(--arc-max 256M --l2 "$work/l2.img:3G")
[ "$origin" = ram ] && mib=1024 cache_args=(--arc-max 2G)
if [ "$origin" = ram ]; then
  head -c $((1 << 30)) /dev/urandom >"$work/seq.img"
  export_args=(--export "s=$work/seq.img")
elif [ "$origin" = nbdkit ]; then
  head -c $((2 << 30)) /dev/urandom >"$work/seq.img"
  "${on_client[@]}" nbdkit --foreground --exit-with-parent -U "$work/origin.sock" --filter=rate file "$work/seq.img" rate=4000M & pids+=($!)
  wait_sock "$work/origin.sock"
  export_args=(--export "s=nbd+unix:///?socket=$work/origin.sock")
else
bench_ceph_up 3393 7493 $((5 << 30))
"$py" "$root/bench/s3tool.py" "$ep" mkbucket bench
head -c $((2 << 30)) /dev/urandom >"$work/seq.img"
"$py" "$root/bench/s3tool.py" "$ep" put bench seq.img "$work/seq.img"
rm -f "$work/seq.img"
export_args=(--export "s=s3://bench/seq.img")
fi

tck=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
ceph_ticks() {
  local t=0 p
  for p in $(pgrep -f '^(ceph-mon|ceph-osd|radosgw) '); do
    [[ $(readlink "/proc/$p/cwd") == "$work"/* ]] || continue
    t=$((t + $(ticks "$p")))
  done
  echo "$t"
}
now() { date +%s.%N; }
# pass START END SERVER_TICKS CEPH_TICKS -> MB/s, server CPU-s per GiB, Ceph CPU-s per GiB
pass() {
  python3 -c "import sys; t=float(sys.argv[2])-float(sys.argv[1]); k=int(sys.argv[5]); \
m=int(sys.argv[6]); print(f'{m/t:.0f}\t{int(sys.argv[3])/k/(m/1024):.2f}\t{int(sys.argv[4])/k/(m/1024):.2f}')" "$@" "$tck" "$mib"
}
rc=(env -u AWS_CA_BUNDLE RCLONE_CONFIG_CEPH_TYPE=s3 RCLONE_CONFIG_CEPH_PROVIDER=Ceph RCLONE_CONFIG_CEPH_ENDPOINT="${ep:-}"
  RCLONE_CONFIG_CEPH_ACCESS_KEY_ID=test RCLONE_CONFIG_CEPH_SECRET_ACCESS_KEY=testtesttest)
uri="nbd+unix:///s?socket=$work/nbd.sock"
: >"$work/runs.tsv"
for round in $(seq "$rounds"); do
  peer=0
  if [ "$origin" = s3 ]; then
    c0=$(ceph_ticks)
    t0=$(now)
    "${rc[@]}" rclone cat ceph:bench/seq.img >/dev/null 2>>"$work/rclone.log"
    t1=$(now)
    c1=$(ceph_ticks)
    peer=$(python3 -c "import sys; print(f'{2048/(float(sys.argv[2])-float(sys.argv[1])):.0f}')" "$t0" "$t1")
    printf 'rclone\t%s\t%s\t%s\n' "$round" "$peer" "$(((c1 - c0)))" >>"$work/runs.tsv"
  fi
  n=0
  for spec in "$@"; do
    n=$((n + 1))
    read -ra arm <<<"$spec"
    rm -f "$work/nbd.sock" "$work/ctl.sock" "$work/l2.img"
    "${on_server[@]}" "${arm[0]}" serve "${export_args[@]}" "${cache_args[@]}" \
      --listen "unix:$work/nbd.sock" --control "$work/ctl.sock" "${arm[@]:1}" >>"$work/serve.log" 2>&1 & arc=$!
    pids+=("$arc")
    wait_sock "$work/nbd.sock"
    line=
    for p in cold warm; do
      a0=$(ticks "$arc")
      c0=$(ceph_ticks)
      t0=$(now)
      "${on_client[@]}" nbdcopy "$uri" null:
      t1=$(now)
      a1=$(ticks "$arc")
      c1=$(ceph_ticks)
      line+=$'\t'$(pass "$t0" "$t1" $((a1 - a0)) $((c1 - c0)))
      # What the feed had put on L2 by the end of the cold pass: the warm
      # pass reads the rest from the origin again.
      if [ "$p" = cold ]; then
        # And how many records the feed examined per MiB it fed
        # (l2_feed_examined; n/a from a build without it).
        # And the reads it sent the origin (GETs on S3, each a request the
        # store bills and spends CPU on).
        read -r l2_mib examined gets < <("${arm[0]}" stat --json --control "$work/ctl.sock" |
          python3 -c "import json, sys; s = json.load(sys.stdin); fed = s.get('l2_feed_bytes', 0) / (1 << 20)
print(s.get('l2_size', 0) >> 20, f\"{s['l2_feed_examined'] / fed:.2f}\" if 'l2_feed_examined' in s and fed else 'n/a', s.get('backing_reads', 'n/a'))")
      fi
    done
    line+=$'\t'$l2_mib$'\t'$examined$'\t'$gets
    echo "round $round, arm $n ($spec): rclone $peer MB/s; cold, warm: ${line//$'\t'/ }" >&2
    printf '%s\t%s\t%s%s\n' "$n" "$round" "$peer" "$line" >>"$work/runs.tsv"
    kill "$arc"; wait "$arc" || true
  done
done
{
  echo "$header"
  echo
  if [ "$origin" = ram ]; then
    echo "job: a 1 GiB local file of random bytes (in the page cache); each arm's server: --export s=FILE --arc-max 2G, no L2, default tunables; nbdcopy reads the export whole through a fresh server (cold: from the file), then again through the same server (warm: every read an ARC hit). Arms take turns, $rounds rounds; no peer and no Ceph (those columns are n/a)."
  elif [ "$origin" = nbdkit ]; then
    echo "job: a 2 GiB local file of random bytes served by nbdkit (file plugin, rate filter at 4000M bits/s); each arm's server: --export s=nbd+unix:///?socket=ORIGIN --arc-max 256M --l2 FILE:3G, default tunables; nbdcopy reads the export whole through a fresh server (cold: from the origin), then again through the same server (warm: from RAM and L2). Arms take turns, $rounds rounds; no peer and no Ceph (those columns are n/a)."
  else
  echo "job: a 2 GiB object of random bytes in a one-node Ceph (memstore OSD, RGW on 127.0.0.1); each arm's server: --export s=s3://bench/seq.img --arc-max 256M --l2 FILE:3G, default tunables; nbdcopy reads the export whole through a fresh server (cold: every byte a ranged GET), then again through the same server (warm: from RAM and L2). Each round first reads the object with \`rclone cat\` (one streaming GET, to /dev/null), the peer; arms take turns, $rounds rounds."
  fi
  bench_arms "$@"
  echo
  [ "${AB_PIN:-0}" = 1 ] && echo "Pinned (AB_PIN=1): the server on core 0, nbdcopy and nbdkit on core 1." && echo
  echo "CPU: seconds per GiB read, the server's own (user + system) and the Ceph daemons' (all three, from /proc); two cores in all, shared by the daemons, the server and nbdcopy."
  echo
  echo "| arm | binary and options | cold MB/s per round | cold median | vs rclone (median of the rounds' ratios) | server CPU-s/GiB cold | Ceph CPU-s/GiB cold | L2 after the cold pass (MiB, median) | records the feed examined per MiB fed, cold (median) | warm MB/s median | server CPU-s/GiB warm | origin reads in the cold pass (GETs on S3; median) |"
  echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  python3 - "$work/runs.tsv" "$@" <<'PY'
import statistics as st, sys
def ceph(r):
    return f"{st.median(float(x[5]) for x in r):.2f}" if int(r[0][2]) else "n/a"
def examined(r):
    v = [float(x[10]) for x in r if len(x) > 10 and x[10] != "n/a"]
    return f"{st.median(v):.2f}" if v else "n/a"
def gets(r):
    v = [int(x[11]) for x in r if len(x) > 11 and x[11].isdigit()]
    return f"{st.median(v):.0f}" if v else "n/a"
def ratio(r):
    return f"{st.median(int(x[3]) / int(x[2]) for x in r):.2f}x" if int(r[0][2]) else "n/a"
runs = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
for n, spec in enumerate(sys.argv[2:], 1):
    r = [x for x in runs if x[0] == str(n)]
    cold = [int(x[3]) for x in r]
    print(f"| {n} | `{spec}` | {' / '.join(map(str, cold))} | {st.median(cold):.0f} "
          f"| {ratio(r)} | {st.median(float(x[4]) for x in r):.2f} "
          f"| {ceph(r)} | {st.median(int(x[9]) for x in r):.0f} | {examined(r)} | {st.median(int(x[6]) for x in r):.0f} "
          f"| {st.median(float(x[7]) for x in r):.2f} | {gets(r)} |")
peer = [int(x[2]) for x in runs if x[0] == "rclone"]
if peer:
    print()
    print(f"rclone cat per round (MB/s): {' / '.join(map(str, peer))}; median {st.median(peer):.0f}.")
PY
} >"$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
cat "$result"
