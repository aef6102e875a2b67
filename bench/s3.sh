#!/usr/bin/env bash
# Issue 21's figures, in one run on a one-node Ceph (tests/ceph/ceph-up.sh:
# RGW for S3), default tunables, a 256M ARC and an L2 file, against
# s3backer with its own block cache given the same memory, rclone, and the
# origin alone (plain ranged GETs from 16 threads, bench/s3tool.py):
#   1. 4K random reads QD16 over a 1 GiB object, warm (one run of the job
#      first), and the first 10 s after a restart (arcache: persistent L2;
#      s3backer: its cache is RAM only), and the L2 device's own ceiling
#      for the warm job (the L2 file read directly at the size and share of
#      reads the job sent it);
#   2. a 2 GiB object read sequentially, cold (arcache: nbdcopy; rclone cat),
#      then again through the same server;
#   3. 4K random writes QD16 with a FLUSH (fsync) after each: arcache's
#      chunked disk on a --log against s3backer's disk;
#   4. Ceph RBD: the random job of 1. over a 1 GiB image, warm, against the
#      image read directly (fio's rbd engine) and nbdkit's memory plugin.
# s3backer stores a disk as its own block objects, so it reads a copy of the
# 1 GiB object written through it, not the object itself, and cannot read
# the 2 GiB object at all.
#
# Usage: bench/s3.sh [SECONDS]   (each timed job; default 20)
#   S3_BENCH_PARTS="random seq write rbd" (the default) picks the parts; a
#   run of only some writes bench/results/s3-PART[-PART].md instead.
# Needs: ceph-mon ceph-osd radosgw (see tests/ceph/ceph-up.sh), s3backer,
# rclone, fio (with its rbd engine), nbdcopy, nbdkit, curl (7.75 or later:
# --aws-sigv4), /usr/bin/time, the venv .ci/run makes (boto3), and for the
# RBD part a binary built with `cargo build --release --features rbd`.
# Writes bench/results/s3.md.
set -euo pipefail
shopt -s inherit_errexit
secs=${1:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
bin=${ARCACHE_BIN:-$root/target/release/arcache}
py=${ARCACHE_MOTO_VENV:-/var/tmp/arcache-moto-venv}/bin/python
parts=${S3_BENCH_PARTS:-random seq write rbd}
want() { [[ " $parts " == *" $1 "* ]]; }
needs=(fio nbdcopy s3backer rclone curl ss /usr/bin/time ceph-mon radosgw fusermount3 "$py" "$bin")
want rbd && needs+=(nbdkit rbd nm)
for t in "${needs[@]}"; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing" >&2; exit 2; }
done
if want rbd && ! nm -D "$bin" | awk '$1 == "U" && $2 == "rbd_open" {found = 1} END {exit !found}'; then
  echo "bench: $bin has no RBD support: cargo build --release --features rbd" >&2
  exit 2
fi
if [ "$parts" = "random seq write rbd" ]; then
  result=$(bench_results s3.md)
else
  result=$(bench_results "s3-${parts// /-}.md")
fi
header=$(bench_header "$secs")
bench_start arcache-s3
mounts=()
cleanup_mounts() {
  for m in "${mounts[@]}"; do fusermount3 -u "$m" 2>/dev/null || true; done
  bench_cleanup
}
trap cleanup_mounts EXIT

rgw_port=7491
bench_ceph_up 3391 $rgw_port $((7 << 30))
s3t() { "$py" "$root/bench/s3tool.py" "$ep" "$@"; }
for b in bench sbr sbw; do s3t mkbucket "$b"; done
echo "bench: uploading 1 GiB and 2 GiB objects" >&2
if want random; then
  head -c $((1 << 30)) /dev/urandom >"$work/rand.img"
  s3t put bench rand.img "$work/rand.img"
  s3t public bench rand.img
fi
if want seq; then
  head -c $((2 << 30)) /dev/urandom >"$work/seq.img"
  s3t put bench seq.img "$work/seq.img"
  rm -f "$work/seq.img"
fi

iops_of() { python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0]; print(round(j[sys.argv[2]]['iops']))" "$1" "$2"; }
fio_job() { # NAME RW TARGET-ARGS... -> IOPS
  local name=$1 rw=$2; shift 2
  timeout $((secs + 300)) fio --name="$name" --rw="$rw" --bs=4k --iodepth=16 --randseed=7 \
    --output-format=json --output="$work/$name.json" "$@" >/dev/null 2>&1 || { echo "bench: fio $name failed" >&2; exit 1; }
  iops_of "$work/$name.json" "${rw#rand}"
}
nbd_args() { echo "--ioengine=nbd --uri=nbd+unix:///$1?socket=$work/nbd.sock"; }

serve_pid=
serve() {
  rm -f "$work/nbd.sock"
  "$bin" serve --listen "unix:$work/nbd.sock" --control "$work/ctl.sock" --arc-max 256M "$@" \
    2>>"$work/serve.log" & serve_pid=$!; pids+=($serve_pid)
  wait_sock "$work/nbd.sock"
}
stop_serve() { kill -TERM "$serve_pid"; wait "$serve_pid" || true; }

sb_pid=
sb_mount() { # BUCKET DIR [options]
  local bucket=$1 dir=$2; shift 2
  mkdir -p "$dir"
  s3backer -f --baseURL="$ep/" --accessId=test --accessKey=testtesttest --size=1G --blockSize=64K \
    --blockCacheSize=4096 "$@" "$bucket" "$dir" 2>>"$work/s3backer.log" & sb_pid=$!; pids+=($sb_pid)
  mounts+=("$dir")
  for _ in $(seq 600); do [ -e "$dir/file" ] && return 0; sleep 0.1; done
  echo "bench: s3backer did not mount" >&2; tail -5 "$work/s3backer.log" >&2; exit 1
}
# Unmounts and waits for s3backer to write its dirty blocks and clear its
# mounted flag (it does both after the unmount).
sb_umount() {
  fusermount3 -u "${mounts[0]}"; mounts=()
  wait "$sb_pid" || true
}

rr=(--size=1G --runtime="$secs" --time_based)
stat_field() { "$bin" stat --json --control "$work/ctl.sock" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
# warm_up EXPORT: the export (1 GiB) read once whole, then the random job
# itself until L2 holds nearly all of it (the feed writes what leaves the
# 256M ARC) or stops growing; at most 8 runs. Prints how many ran.
warm_up() {
  local last=0 now i
  nbdcopy "nbd+unix:///$1?socket=$work/nbd.sock" null:
  for i in $(seq 8); do
    fio_job "warm-$1-$i" randread $(nbd_args "$1") "${rr[@]}" >/dev/null
    now=$(stat_field l2_size)
    echo "bench: warm-up run $i: L2 holds $((now >> 20)) MiB" >&2
    [ "$now" -ge $((900 << 20)) ] && break
    [ "$now" -le $((last + last / 20)) ] && break
    last=$now
  done
  echo "$i"
}

origin_py= origin_curl= rbd_direct= rbd_warm= rbd_warm_runs= random_warm_runs= nbd_ceiling= l2_per_read= l2_read_kib= l2_raw= l2_raw4= l2_ceiling= l2_ceiling4= arc_warm= sb_warm= origin= arc_restart= sb_restart= seq_cold= seq_again= rclone_s= rclone_pipe_s= seq_hwm= arc_w= sb_w= l2hits= txg_syncs= seq_gets=
# 1. random reads
if want random; then
echo "bench: random reads, origin alone" >&2
origin_py=$(s3t randget bench rand.img "$secs" 16 4096)
# The same from curl (C, 16 GETs at once; 1,000 GETs per second of the
# job, all of them, timed), so the origin's figure is RGW's and not one
# client's: the faster of the two is the origin.
python3 - "$ep/bench/rand.img" $((secs * 1000)) >"$work/rr.cfg" <<'PY'
import random, sys
rng = random.Random(7)
blocks = (1 << 30) // 4096
for i in range(int(sys.argv[2])):
    at = rng.randrange(blocks) * 4096
    print(("next\n" if i else "") + f'url = "{sys.argv[1]}"\nrange = "{at}-{at + 4095}"\noutput = "/dev/null"\nwrite-out = "%{{http_code}}\\n"')
PY
t0=$(date +%s.%N)
curl -s --no-progress-meter --parallel --parallel-immediate --parallel-max 16 -K "$work/rr.cfg" >"$work/rr.codes"
t1=$(date +%s.%N)
[ "$(grep -cx 206 "$work/rr.codes")" = $((secs * 1000)) ] || { echo "bench: curl's ranged GETs: $(sort "$work/rr.codes" | uniq -c)" >&2; exit 1; }
origin_curl=$(python3 -c "import sys; print(round(int(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2]))))" $((secs * 1000)) "$t0" "$t1")
origin=$(( origin_py > origin_curl ? origin_py : origin_curl ))
echo "bench: random reads, arcache" >&2
serve --export "r=s3://bench/rand.img" --l2 "$work/l2.img:2G"
random_warm_runs=$(warm_up r)
"$bin" stat --json --control "$work/ctl.sock" >"$work/stat-before-warm.json"
arc_warm=$(fio_job arcwarm randread $(nbd_args r) "${rr[@]}")
"$bin" stat --json --control "$work/ctl.sock" >"$work/stat-warm.json"
stop_serve
serve --export "r=s3://bench/rand.img" --l2 "$work/l2.img:2G"
arc_restart=$(fio_job arcrestart randread $(nbd_args r) --size=1G --runtime=10 --time_based)
stop_serve
# The L2 device's own ceiling for the warm job: the timed job's L2 reads per
# client read and their mean size (from the stats around it), and the L2
# file read directly at that size, O_DIRECT at QD16 (no more than 16 client
# reads, so no more than 16 L2 reads, are ever under way). No cache with
# this ARC over this device serves more than raw / (L2 reads per read).
read -r l2_per_read l2_read_kib < <(python3 - "$work/stat-before-warm.json" "$work/stat-warm.json" "$work/arcwarm.json" <<'PY'
import json, sys
a, b, f = (json.load(open(p)) for p in sys.argv[1:])
reads = f["jobs"][0]["read"]["total_ios"]
dev = lambda s, k: sum(d[k] for d in s["l2_devices"])
n = dev(b, "reads") - dev(a, "reads")
size = (dev(b, "read_bytes") - dev(a, "read_bytes")) / max(n, 1)
print(f"{n / reads:.3f}", max(4, -(-int(size) // 4096) * 4))
PY
)
l2_raw=$(fio_job l2raw randread --filename="$work/l2.img" --direct=1 --ioengine=io_uring \
  --bs="${l2_read_kib}k" --runtime="$secs" --time_based)
l2_raw4=$(fio_job l2raw4 randread --filename="$work/l2.img" --direct=1 --ioengine=io_uring --runtime="$secs" --time_based)
per() { python3 -c "import sys; print(round(float(sys.argv[1]) / float(sys.argv[2])) if float(sys.argv[2]) else 0)" "$1" "$2"; }
l2_ceiling=$(per "$l2_raw" "$l2_per_read")
l2_ceiling4=$(per "$l2_raw4" "$l2_per_read")
echo "bench: random reads, s3backer" >&2
sb_mount sbr "$work/sbr"
dd if="$work/rand.img" of="$work/sbr/file" bs=1M oflag=direct status=none
sync
sb_umount
sb_mount sbr "$work/sbr" --listBlocks
sbf=(--filename="$work/sbr/file" --ioengine=libaio --direct=1 "${rr[@]}")
# The same warm-up: the file read whole, then the job (its cache holds 256
# MiB, so a second run adds nothing more).
dd if="$work/sbr/file" of=/dev/null bs=1M iflag=direct status=none
fio_job sbwarmup randread "${sbf[@]}" >/dev/null
sb_warm=$(fio_job sbwarm randread "${sbf[@]}")
sb_umount
sb_mount sbr "$work/sbr" --listBlocks
sb_restart=$(fio_job sbrestart randread --filename="$work/sbr/file" --ioengine=libaio --direct=1 --size=1G --runtime=10 --time_based)
sb_umount
rm -f "$work/rand.img"
l2hits=$(python3 -c "import json; print(json.load(open('$work/stat-warm.json')).get('l2_hits', 0))")
fi

# 2. sequential read of 2 GiB, cold
if want seq; then
echo "bench: sequential reads" >&2
rc=(env -u AWS_CA_BUNDLE RCLONE_CONFIG_CEPH_TYPE=s3 RCLONE_CONFIG_CEPH_PROVIDER=Ceph RCLONE_CONFIG_CEPH_ENDPOINT="$ep"
  RCLONE_CONFIG_CEPH_ACCESS_KEY_ID=test RCLONE_CONFIG_CEPH_SECRET_ACCESS_KEY=testtesttest)
mbps() { python3 -c "import sys; print(round(2048 / float(sys.argv[1])))" "$1"; }
# Where each reader's time goes: the Ceph daemons share the two cores with
# the reader, so what serving a reader costs them counts against every
# reader's rate. CPU seconds of this run's daemons, from /proc.
tck=$(getconf CLK_TCK)
ceph_ticks() {
  local t=0 p
  for p in $(pgrep -f '^(ceph-mon|ceph-osd|radosgw) '); do
    [[ $(readlink "/proc/$p/cwd") == "$work"/* ]] || continue
    t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t"
}
pid_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
secs_of() { python3 -c "import sys; print(f'{int(sys.argv[1]) / int(sys.argv[2]):.2f}')" "$1" "$tck"; }
# Runs a command; its wall time, and its own CPU seconds into $work/cpu.
timed_cpu() {
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$work/time.out" "$@" >/dev/null
  t1=$(date +%s.%N)
  awk '{printf "%.2f", $1 + $2}' "$work/time.out" >"$work/cpu"
  python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t0" "$t1"
}
c0=$(ceph_ticks)
rclone_s=$(timed_cpu "${rc[@]}" rclone cat ceph:bench/seq.img)
rclone_cpu=$(cat "$work/cpu")
rclone_ceph=$(secs_of $(($(ceph_ticks) - c0)))
# The same bytes handed on to a second process through a pipe, as an NBD
# server hands them to its client: what one more copy between processes
# costs on two cores the Ceph daemons share (the reader's CPU is rclone's
# and dd's).
c0=$(ceph_ticks)
rclone_pipe_s=$(timed_cpu bash -c '"$@" | dd of=/dev/null bs=256k status=none' _ "${rc[@]}" rclone cat ceph:bench/seq.img)
rclone_pipe_cpu=$(cat "$work/cpu")
rclone_pipe_ceph=$(secs_of $(($(ceph_ticks) - c0)))
# A bare client sending the GETs arcache's stream sends (the object's read
# unit, 8 MiB, eight at once: its prefetch threads) and keeping nothing:
# what reading in those GETs costs on this host, without a cache's work.
# Also in GETs of 32 MiB, 4 at once: what the GET size alone costs Ceph.
ranges_cfg() { # UNIT_MIB -> a curl config of ranged GETs of the object
python3 - "$ep/bench/seq.img" $((2 << 30)) $(($1 << 20)) <<'PY'
import sys
url, size, unit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
blocks = []
for at in range(0, size, unit):
    blocks.append("\n".join([
        f'url = "{url}"', f'range = "{at}-{min(at + unit, size) - 1}"', 'output = "/dev/null"',
        'aws-sigv4 = "aws:amz:us-east-1:s3"', 'user = "test:testtesttest"',
        'header = "x-amz-content-sha256: UNSIGNED-PAYLOAD"', 'write-out = "%{http_code}\\n"']))
print("\nnext\n".join(blocks))
PY
}
# curl_run UNIT_MIB PARALLEL: sets curl_s, curl_cpu, curl_ceph, curl_gets
curl_run() {
  ranges_cfg "$1" >"$work/ranges.cfg"
  c0=$(ceph_ticks)
  curl_s=$(timed_cpu bash -c "curl -s --no-progress-meter --parallel --parallel-max $2 -K '$work/ranges.cfg' >'$work/codes'")
  curl_cpu=$(cat "$work/cpu")
  curl_ceph=$(secs_of $(($(ceph_ticks) - c0)))
  curl_gets=$(wc -l <"$work/codes")
  [ "$(grep -cx 206 "$work/codes")" = "$curl_gets" ] || { echo "bench: a ranged GET of curl failed: $(sort "$work/codes" | uniq -c)" >&2; exit 1; }
}
curl_run 32 4
curl32=("$curl_s" "$curl_gets" "$curl_ceph" "$curl_cpu")
curl_run 8 8
# How many of arcache's GETs are under way at once during the cold pass:
# every 0.2 s (one `ss` a sample, so the sampling takes little of the CPU
# the pass is bound by), the connections to the endpoint whose received
# bytes grew since the sample before, told apart by their local port.
gets_in_flight() { # PID: samples until PID ends, one count a line
  python3 - "${ep##*:}" "$1" >"$work/inflight" <<'PY'
import os, re, subprocess, sys, time
port, until = sys.argv[1], int(sys.argv[2])
prev = None
while True:
    try:
        os.kill(until, 0)
    except ProcessLookupError:
        break
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True).stdout
    cur = dict(re.findall(r":(\d+)\s+\S+:" + port + r"\b[^\n]*\n[^\n]*?bytes_received:(\d+)", out))
    if prev is not None:
        print(sum(1 for k, v in cur.items() if prev.get(k) != v), flush=True)
    prev = cur
    time.sleep(0.2)
PY
}
serve --export "s=s3://bench/seq.img" --l2 "$work/l2s.img:3G"
c0=$(ceph_ticks)
a0=$(pid_ticks "$serve_pid")
sleep 1000 & sampling_until=$!
gets_in_flight "$sampling_until" & sampler=$!; pids+=("$sampling_until" "$sampler")
seq_cold=$(timed_cpu nbdcopy "nbd+unix:///s?socket=$work/nbd.sock" null:)
kill "$sampling_until"; wait "$sampler" 2>/dev/null || true
nbdcopy_cpu=$(cat "$work/cpu")
arc_ceph=$(secs_of $(($(ceph_ticks) - c0)))
arc_cpu=$(secs_of $(($(pid_ticks "$serve_pid") - a0)))
inflight=$(python3 -c "import sys; v=[int(x) for x in open(sys.argv[1]) if x.strip()]; print(f'{sum(v)/len(v):.1f}' if v else 'n/a')" "$work/inflight")
seq_gets=$(stat_field backing_reads)
seq_hwm=$(awk '/^VmHWM:/ {printf "%d", $2 / 1024}' "/proc/$serve_pid/status")
a0=$(pid_ticks "$serve_pid")
seq_again=$(timed_cpu nbdcopy "nbd+unix:///s?socket=$work/nbd.sock" null:)
again_nbdcopy_cpu=$(cat "$work/cpu")
again_cpu=$(secs_of $(($(pid_ticks "$serve_pid") - a0)))
"$bin" stat --json --control "$work/ctl.sock" >"$work/stat-seq.json"
stop_serve
fi

# 3. 4K writes with a FLUSH after each
if want write; then
echo "bench: writes with FLUSH" >&2
serve --export "w=s3://bench/disk/?size=1G" --log "$work/log.img:256M"
wr=(--size=1G --runtime="$secs" --time_based --fsync=1)
arc_w=$(fio_job arcw randwrite $(nbd_args w) "${wr[@]}")
# A figure of a disk whose txgs fail (the data piling up in the log and
# RAM) would not be a figure of this job: refuse it.
"$bin" stat --json --control "$work/ctl.sock" >"$work/stat-write.json"
txg_errors=$(python3 -c "import json; print(json.load(open('$work/stat-write.json'))['txg_sync_errors'])" )
txg_syncs=$(python3 -c "import json; print(json.load(open('$work/stat-write.json'))['txg_syncs'])" )
[ "$txg_errors" = 0 ] || { echo "bench: $txg_errors txg syncs of the written disk failed" >&2; grep -i warn "$work/serve.log" | tail -5 >&2; exit 1; }
stop_serve
sb_mount sbw "$work/sbw"
sb_w=$(fio_job sbw randwrite --filename="$work/sbw/file" --ioengine=libaio --direct=1 "${wr[@]}")
sb_umount
fi

# 4. Ceph RBD: the same random job over a 1 GiB image, warm, against the
# image read directly (fio's rbd engine, librbd) and against the fastest an
# NBD server can answer this job on this host (nbdkit's memory plugin: the
# data in RAM, no cache at all).
if want rbd; then
echo "bench: RBD" >&2
conf=$work/ceph/ceph.conf
head -c $((1 << 30)) /dev/urandom >"$work/rbd.img"
rbd -c "$conf" import --no-progress "$work/rbd.img" rbd/bench
# The NBD ceiling's server holds the same bytes (a memory plugin never
# written would answer zeros from holes).
nbdkit -U "$work/mem.sock" --exit-with-parent -f memory 1G & pids+=($!)
wait_sock "$work/mem.sock"
nbdcopy "$work/rbd.img" "nbd+unix:///?socket=$work/mem.sock"
rm -f "$work/rbd.img"
rbd_direct=$(CEPH_CONF=$conf fio_job rbddirect randread --ioengine=rbd --clientname=admin --pool=rbd --rbdname=bench "${rr[@]}")
serve --export "b=rbd:rbd/bench?conf=$conf" --l2 "$work/l2b.img:2G"
rbd_warm_runs=$(warm_up b)
rbd_warm=$(fio_job rbdwarm randread $(nbd_args b) "${rr[@]}")
stop_serve
nbd_ceiling=$(fio_job memory randread --ioengine=nbd --uri="nbd+unix:///?socket=$work/mem.sock" "${rr[@]}")
fi

ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}x' if b else 'n/a')" "$1" "$2"; }
# The figures worked out from others are worked out first, one to a line:
# a failed $(...) in echo's arguments, or in any but the last assignment
# of a line, would not stop the script under set -e.
if want random; then
  warm_vs_sb=$(ratio "$arc_warm" "$sb_warm")
  warm_vs_origin=$(ratio "$arc_warm" "$origin")
  restart_vs_sb=$(ratio "$arc_restart" "$sb_restart")
  ceiling_vs_origin=$(ratio "$l2_ceiling" "$origin")
  warm_vs_ceiling=$(ratio "$arc_warm" "$l2_ceiling")
  ceiling4_vs_origin=$(ratio "$l2_ceiling4" "$origin")
fi
if want seq; then
  seq_cold_mbps=$(mbps "$seq_cold")
  seq_again_mbps=$(mbps "$seq_again")
  rclone_mbps=$(mbps "$rclone_s")
  rclone_pipe_mbps=$(mbps "$rclone_pipe_s")
  curl_mbps=$(mbps "$curl_s")
  curl32_mbps=$(mbps "${curl32[0]}")
  seq_cold_vs_rclone=$(ratio "$seq_cold_mbps" "$rclone_mbps")
fi
if want write; then
  w_vs_sb=$(ratio "$arc_w" "$sb_w")
fi
if want rbd; then
  rbd_warm_vs_direct=$(ratio "$rbd_warm" "$rbd_direct")
  nbd_ceiling_vs_direct=$(ratio "$nbd_ceiling" "$rbd_direct")
fi
{
  echo "$header"
  echo
  echo "One-node Ceph 16.2 (memstore OSD, RGW on 127.0.0.1), arcache with default tunables, --arc-max 256M and an L2 file; s3backer with --blockSize=64K --blockCacheSize=4096 (256 MiB); 4K jobs at QD16 (fio; arcache through its NBD engine, s3backer's FUSE file with libaio and O_DIRECT); ${secs} s per timed job."
  echo
  if want random || want seq || want write; then
  echo "| job | arcache | s3backer | origin alone / rclone | arcache vs s3backer | arcache vs origin |"
  echo "|---|---:|---:|---:|---:|---:|"
  if want random; then
    echo "| 4K random reads QD16, 1 GiB object, warm (IOPS) | $arc_warm | $sb_warm | $origin | $warm_vs_sb | $warm_vs_origin |"
    echo "| the same, first 10 s after a restart (IOPS) | $arc_restart | $sb_restart | | $restart_vs_sb | |"
    echo "| the L2 device's ceiling for the warm job (IOPS; see below) | $l2_ceiling | | $origin | | $ceiling_vs_origin |"
  fi
  if want seq; then
    echo "| 2 GiB object read sequentially, cold (MB/s) | $seq_cold_mbps | n/a | $rclone_mbps (rclone cat) | | $seq_cold_vs_rclone |"
    echo "| the same object again, same server (MB/s) | $seq_again_mbps | n/a | | | |"
  fi
  if want write; then
    echo "| 4K random writes QD16, fsync after each (IOPS) | $arc_w | $sb_w | | $w_vs_sb | |"
  fi
  fi
  if want rbd; then
    echo
    echo "Ceph RBD (the same OSD: memstore, in RAM), 4K random reads QD16 over a 1 GiB image of random bytes; arcache warm (the image read whole with nbdcopy, then $rbd_warm_runs run(s) of the job until L2 held 900 MiB or stopped growing); nbdkit's memory plugin holding the same bytes:"
    echo
    echo "| server | IOPS | vs RBD direct |"
    echo "|---|---:|---:|"
    echo "| RBD direct (fio's rbd engine) | $rbd_direct | 1.00x |"
    echo "| arcache over rbd:rbd/bench, warm | $rbd_warm | $rbd_warm_vs_direct |"
    echo "| nbdkit memory plugin (the image's bytes in RAM, no cache; this host's NBD ceiling for the job) | $nbd_ceiling | $nbd_ceiling_vs_direct |"
  fi
  if want seq; then
    echo
    echo "The cold sequential pass sent $seq_gets GETs for the 2 GiB object (backing_reads)."
    echo
    echo "Where the cold read's time goes (CPU seconds for the 2 GiB object; the Ceph daemons' from /proc, the others' own; two cores in all):"
    echo
    echo "| reader | MB/s | GETs | Ceph daemons | reader | its client |"
    echo "|---|---:|---:|---:|---:|---:|"
    echo "| rclone cat (one streaming GET) | $rclone_mbps | 1 | $rclone_ceph | $rclone_cpu | |"
    echo "| rclone cat piped to dd (its bytes handed to one more process) | $rclone_pipe_mbps | 1 | $rclone_pipe_ceph | $rclone_pipe_cpu | |"
    echo "| curl, ranged GETs of 8 MiB, 8 at once, bytes dropped | $curl_mbps | $curl_gets | $curl_ceph | $curl_cpu | |"
    echo "| curl, ranged GETs of 32 MiB, 4 at once, bytes dropped | $curl32_mbps | ${curl32[1]} | ${curl32[2]} | ${curl32[3]} | |"
    echo "| arcache, cold, read by nbdcopy | $seq_cold_mbps | $seq_gets | $arc_ceph | $arc_cpu | $nbdcopy_cpu |"
    echo "| arcache, the same again (from RAM and L2; no GETs) | $seq_again_mbps | | | $again_cpu | $again_nbdcopy_cpu |"
    echo
    echo "GETs under way at once during arcache's cold pass (connections receiving, sampled every 0.2 s): $inflight on average; curl above keeps 8 (or 4) under way by construction."
    echo
    echo "arcache's peak resident memory by the end of the cold pass (VmHWM): $seq_hwm MiB, for an ARC of at most 256 MiB."
  fi
  if want write; then
    echo
    echo "The written disk: $txg_syncs txgs synced to the bucket during the job, none failed (checked)."
  fi
  echo
  echo "Parts run: $parts."
  if want random; then
    echo "The L2 device's ceiling: in the timed warm job $l2_per_read L2 reads per client read (the rest from RAM), ${l2_read_kib} KiB each on average; the L2 file read directly at that size (fio, O_DIRECT, io_uring, QD16, random) gives $l2_raw IOPS, so no cache with this ARC over this device serves more than $l2_raw / $l2_per_read = $l2_ceiling IOPS ($ceiling_vs_origin the origin); arcache reached $warm_vs_ceiling of it. A cache reading only the 4 KiB each request wants from the same device: $l2_raw4 IOPS raw, at most $l2_ceiling4 ($ceiling4_vs_origin the origin)."
    echo "The origin alone: $origin_py IOPS from bench/s3tool.py (16 threads of plain ranged GETs), $origin_curl from curl (16 GETs at once); the table's figure is the faster."
    echo "arcache's warm-up: the object read whole with nbdcopy, then $random_warm_runs run(s) of the job until L2 held 900 MiB or stopped growing; L2 hits counted by then: $l2hits. s3backer's: the file read whole, then one run of the job. s3backer cannot read a plain object (it stores a disk as its own block objects), so it has no sequential figure; its random reads are of a copy of the 1 GiB object written through it."
  fi
} >"$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
cat "$result"
