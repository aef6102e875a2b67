#!/usr/bin/env bash
# Same-run A/B of arcache builds or settings on 4K random reads at QD16.
# AB_JOB picks what serves them:
#   arc-hit (default): a 256 MiB file export read whole twice first, so
#     every timed read is an ARC hit (--arc-max 1G);
#   l2-hit: seed 003's job: 1 GiB of a slow origin (nbdkit file + delay
#     4 ms + rate 2400M) through --arc-max 256M and --l2 FILE:4G, one run
#     of the timed job first as its warm-up, so most timed reads hit L2;
#   cold-miss: a 2 GiB file export opened O_DIRECT (--direct) through
#     --arc-max 64M, no warm-up: nearly every timed read misses RAM and
#     reads its record from the file; AB_DIRECT=0 opens it without
#     O_DIRECT, so the records come from the page cache (the machine's
#     CPU, not its disk, is measured).
# AB_DATA=compressible fills the exports with bytes that compress (each
# 4 KiB: 1 KiB of random bytes, then zeros) instead of random bytes.
# Each run also reports the server's resident memory beyond the cached
# data, per cached record: what a record costs in headers, policy entries
# and indexes (cold-miss caches nothing before its timed job: there, the
# whole RSS beyond the data, of a server that has served no read yet).
#
# Usage: bench/ab-read.sh SECONDS ROUNDS ARM...
#   An ARM is a binary, optionally followed (in the same word) by serve
#   options: "target/release/arcache --policy arc". Arms take turns, so a
#   machine whose speed drifts treats them alike; the same arm twice is an
#   A/A run (the noise an A/B must clear). Name binaries of other commits
#   by their commit (/var/tmp/arcache-4a45d3c): the header names only the
#   commit of this tree, and a line per arm the commit its binary says it
#   was built from (`arcache --version`). ARCACHE_EXTRA adds serve options to every arm.
# Writes bench/results/ab-read-JOB.md, or ab-read-JOB-$AB_NAME.md when AB_NAME is set.
# A named result that exists already is kept (the script stops first);
# AB_OVERWRITE=1 replaces it.
set -euo pipefail
secs=${1:?seconds}; rounds=${2:?rounds}; shift 2
[ $# -ge 1 ] || { echo "usage: $0 SECONDS ROUNDS ARM..." >&2; exit 2; }
for t in fio python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (apt-get install fio)" >&2; exit 2; }
done
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
result=$(bench_ab_results "ab-read-${AB_JOB:-arc-hit}${AB_NAME:+-$AB_NAME}.md") || exit 2
header=$(bench_header "$secs" "$rounds" "${@@Q}")
bench_start arcache-ab-read

data=${AB_DATA:-random}
# fill FILE BYTES: the export's contents, as AB_DATA says.
fill() {
  case $data in
    random) head -c "$2" /dev/urandom > "$1" ;;
    compressible) python3 -c '
import os, sys
with open(sys.argv[1], "wb") as f:
    for _ in range(int(sys.argv[2]) >> 20):
        f.write(b"".join(os.urandom(1024) + bytes(3072) for _ in range(256)))
' "$1" "$2" ;;
    *) echo "bench: AB_DATA is random or compressible" >&2; exit 2 ;;
  esac
}
job=${AB_JOB:-arc-hit}
case $job in
  arc-hit)
    fill "$work/disk.img" $((256 << 20))
    export_of=("$work/disk.img"); size=256M; serve_extra=(--arc-max 1G) ;;
  l2-hit)
    command -v nbdkit >/dev/null || { echo "bench: nbdkit is missing" >&2; exit 2; }
    fill "$work/origin.img" $((1 << 30))
    nbdkit --foreground --exit-with-parent -U "$work/origin.sock" --filter=rate --filter=delay \
      file "$work/origin.img" rdelay=4ms rate=2400M & pids+=($!)
    wait_sock "$work/origin.sock"
    export_of=("nbd+unix:///?socket=$work/origin.sock"); size=1G; serve_extra=(--arc-max 256M) ;;
  cold-miss)
    fill "$work/disk.img" $((2 << 30))
    export_of=("$work/disk.img"); size=2G; serve_extra=(--arc-max 64M)
    [ "${AB_DIRECT:-1}" = 1 ] && serve_extra+=(--direct) ;;
  *) echo "bench: AB_JOB is arc-hit, l2-hit or cold-miss" >&2; exit 2 ;;
esac
# A failed fio run stops the script: going on would read the JSON of the
# run before it as this one's.
fio_nbd() {
  rm -f "$work/fio.json"
  timeout $((secs + 120)) fio --name=ab --ioengine=nbd --uri="nbd+unix:///?socket=$work/nbd.sock" \
    --output-format=json --output="$work/fio.json" "$@" >/dev/null 2>&1 ||
    { echo "bench: fio failed ($*)" >&2; exit 1; }
}
stat_of() { "$1" stat --json --control "$work/ctl.sock"; }
# The block device holding the work directory (the L2 file, the file
# export), whose /proc/diskstats line tells what the device itself did
# during the timed job: an L2 hit's time splits into the device's and the
# server's pipeline's.
# Found by its major:minor, which names it in /proc/diskstats whatever
# the mount calls it (/dev/root, a mapper name); none (tmpfs, overlay):
# the columns say n/a.
disk_major= disk_minor=
IFS=: read -r disk_major disk_minor < <(findmnt -no MAJ:MIN -T "$work" | tr -d ' ') || true
disk=$(awk -v a="$disk_major" -v b="$disk_minor" '$1 == a && $2 == b {print $3}' /proc/diskstats)
disk_stats() { # reads completed, sectors read, ms reading
  [ -z "$disk" ] || awk -v d="$disk" '$3 == d {print $4, $6, $7}' /proc/diskstats
}
for _ in $(seq "$rounds"); do
  n=0
  for spec in "$@"; do
    n=$((n + 1))
    read -ra arm <<<"$spec"
    bin=${arm[0]}
    rm -f "$work/nbd.sock" "$work/ctl.sock" "$work/l2.img"
    l2=(); [ "$job" = l2-hit ] && l2=(--l2 "$work/l2.img:4G")
    # shellcheck disable=SC2086
    "$bin" serve --export "${export_of[@]}" "${serve_extra[@]}" "${l2[@]}" --listen "unix:$work/nbd.sock" \
      --control "$work/ctl.sock" "${arm[@]:1}" ${ARCACHE_EXTRA:-} >>"$work/serve.log" 2>&1 & arc=$!
    pids+=("$arc")
    wait_sock "$work/nbd.sock"; wait_sock "$work/ctl.sock"
    if [ "$job" = arc-hit ]; then
      fio_nbd --rw=read --bs=1M --size=256M --iodepth=4
      fio_nbd --rw=read --bs=1M --size=256M --iodepth=4
    elif [ "$job" = l2-hit ]; then
      fio_nbd --rw=randread --bs=4k --size=1G --iodepth=16 --time_based --runtime="$secs" --randseed=7
    fi
    # Memory first: stat builds the sizing curves, whose miniature replays
    # allocate; that is the cost of asking, not of holding records.
    rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$arc/status")
    # Anonymous pages alone: VmRSS also counts the binary's own mapped
    # pages, which follow the page cache, not the server (a build just made
    # had 1 MB more of them at idle than an older one: RssFile).
    anon_kb=$(awk '/^RssAnon/ {print $2}' "/proc/$arc/status")
    before=$(stat_of "$bin")
    if [ "$job" = cold-miss ]; then
      cached=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["hash_elements"])' "$before")
      [ "$cached" = 0 ] || { echo "bench: the cold-miss server cached $cached records before its timed job" >&2; exit 1; }
    fi
    # The server's CPU time (user + system, clock ticks) around the timed job.
    cpu0=$(awk '{print $14 + $15}' "/proc/$arc/stat")
    disk0=$(disk_stats)
    fio_nbd --rw=randread --bs=4k --size="$size" --iodepth=16 --time_based --runtime="$secs" --randseed=7
    disk1=$(disk_stats)
    cpu1=$(awk '{print $14 + $15}' "/proc/$arc/stat")
    after=$(stat_of "$bin")
    line=$(python3 - "$work/fio.json" "$rss_kb" "$before" "$after" "$((cpu1 - cpu0))" "$(getconf CLK_TCK)" "$disk0" "$disk1" "$anon_kb" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
iops = round(job["read"]["iops"])
cpu_us = int(sys.argv[5]) / int(sys.argv[6]) * 1e6 / max(job["read"]["total_ios"], 1)
b, a = json.loads(sys.argv[3]), json.loads(sys.argv[4])
hits = a["demand_data_hits"] - b["demand_data_hits"]
misses = a["demand_data_misses"] - b["demand_data_misses"]
l2 = a.get("l2_hits", 0) - b.get("l2_hits", 0)
# With nothing cached before the timed job (cold-miss), the whole RSS
# beyond the data.
records = b["hash_elements"]
overhead = (int(sys.argv[2]) * 1024 - b["data_size"]) / max(records, 1)
anon = (int(sys.argv[9]) * 1024 - b["data_size"]) / max(records, 1)
# reads completed, sectors read, ms reading (summed over reads, so its
# growth over the job's seconds is the mean number of reads in flight)
dev = "nan\tnan\tnan\tnan"
if sys.argv[7].strip() and sys.argv[8].strip():
    d0, d1 = (list(map(int, x.split())) for x in sys.argv[7:9])
    secs = job["read"]["runtime"] / 1000 or 1
    reads = d1[0] - d0[0]
    kib = (d1[1] - d0[1]) / 2 / max(reads, 1)
    dev = f"{reads / secs:.0f}\t{(d1[2] - d0[2]) * 1000 / max(reads, 1):.0f}\t{(d1[2] - d0[2]) / 1000 / secs:.1f}\t{kib:.1f}"
print(f"{iops}\t{100 * hits / max(hits + misses, 1):.2f}\t{records}\t{overhead:.0f}\t{b.get('policy', 'arc')}\t{l2}\t{cpu_us:.1f}"
      f"\t{dev}\t{anon:.0f}")
PY
)
    echo "$spec: $line"
    printf '%s\t%s\n' "$n" "$line" >>"$work/runs.tsv"
    kill "$arc"; wait "$arc" || true
  done
done
{
  echo "$header"
  echo
  if [ "$job" = arc-hit ]; then
    echo "job arc-hit: a 256 MiB file of $data bytes, read whole twice first; arcache --arc-max 1G${ARCACHE_EXTRA:+ $ARCACHE_EXTRA}"
  elif [ "$job" = cold-miss ]; then
    echo "job cold-miss: a 2 GiB file of $data bytes; arcache ${serve_extra[*]}${ARCACHE_EXTRA:+ $ARCACHE_EXTRA}; no warm-up"
  else
    echo "job l2-hit: 1 GiB origin (nbdkit file, delay rdelay=4ms, rate 2400M); arcache --arc-max 256M --l2 FILE:4G${ARCACHE_EXTRA:+ $ARCACHE_EXTRA}; one timed job first as warm-up"
  fi
  [ "$data" = compressible ] && echo "data: each 4 KiB of the export holds 1 KiB of random bytes, then zeros"
  echo "timed: fio --ioengine=nbd --rw=randread --bs=4k --size=$size --iodepth=16 --runtime=$secs --randseed=7; arms take turns, $rounds rounds"
  bench_arms "$@"
  if [ "$job" = cold-miss ]; then
    mem_col="RSS beyond data (bytes, median)"
    anon_col="anonymous RSS beyond data (bytes, median)"
    echo "memory: server VmRSS - data_size before the timed job (nothing is cached yet), before any stat request; anonymous: RssAnon, without the binary's mapped pages"
  else
    mem_col="RSS beyond data per record (bytes, median)"
    anon_col="anonymous RSS beyond data per record (bytes, median)"
    echo "memory: (server VmRSS - data_size) / cached records, after the warm-up, before any stat request; anonymous: RssAnon in place of VmRSS, without the binary's mapped pages (which follow the page cache)"
  fi
  echo
  echo "cpu: the server's user + system time during the timed job over the reads fio completed"
  echo "device: what /proc/diskstats says ${disk:-n/a (no block device under the work directory)} (holding the L2 file and the file exports; reads of anything else on it count too) did during the timed job: reads/s, mean read time, mean reads in flight (of the 16 fio keeps outstanding; the rest are in the server's pipeline or fio), mean read size; each the median over the rounds"
  echo
  echo "| arm | binary and options | policy | IOPS per round | median IOPS | ARC demand hit % (lowest) | L2 hits (last run) | ARC records | $mem_col | server CPU per read (us, median) | device reads/s, us, in flight, KiB | $anon_col |"
  echo "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  python3 - "$work/runs.tsv" "$@" <<'PY'
import math, statistics, sys
runs = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
def dev(r):
    cols = [statistics.median(float(x[i]) for x in r) for i in range(8, 12)]
    if any(math.isnan(c) for c in cols):
        return "n/a"
    return f"{cols[0]:,.0f}, {cols[1]:.0f}, {cols[2]:.1f}, {cols[3]:.1f}"
for n, spec in enumerate(sys.argv[2:], 1):
    r = [x for x in runs if x[0] == str(n)]
    iops = [int(x[1]) for x in r]
    print(f"| {n} | `{spec}` | {r[0][5]} | {' / '.join(f'{i:,}' for i in iops)} | {statistics.median(iops):,.0f} "
          f"| {min(float(x[2]) for x in r):.2f} | {int(r[-1][6]):,} | {r[0][3]} | {statistics.median(float(x[4]) for x in r):,.0f} "
          f"| {statistics.median(float(x[7]) for x in r):.1f} "
          f"| {dev(r)} | {statistics.median(float(x[12]) for x in r):,.0f} |")
PY
} > "$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
cat "$result"
