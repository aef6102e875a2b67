#!/usr/bin/env bash
# The write-path figures, in one run (issue 5):
#   origin  = nbdkit memory plugin with the delay (4 ms per read and write)
#             and rate (2400 Mbit/s) filters: a slow array that acknowledges
#             writes only when they are done;
#   arcache = arcache serve in front of it, --arc-max 256M, default write
#             tunables, and for the "log" rows a 1 GiB intent log file on
#             local disk (--log).
#
# 1. 4K random writes at queue depth 16 with a FLUSH after each write
#    (fio --fsync=1): the origin alone, arcache without a log (each FLUSH
#    syncs a txg to the origin, as a pool without SLOG does), arcache with
#    the log in sync=standard and in sync=always, and sync=disabled (no
#    durability: the ceiling this machine's CPUs allow the same job).
# 2. Seed 002's sequence: sequential 1 MiB writes of a region twice the ARC
#    (512 MiB, QD1 like dd, fsync at the end), reads of it after a restart
#    ("dropped cache"), then three more reads ("without cache drop").
# Writes the tables to bench/results/write-path.txt (commit and date on its
# first line).
#
# Usage: bench/write-path.sh [SECONDS_PER_RANDOM_JOB]   (default 15; about 4 minutes)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-15}
for t in fio nbdkit python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (apt-get install fio nbdkit)" >&2; exit 2; }
done
cargo build --release --quiet --manifest-path "$here/Cargo.toml"
bin="$here/target/release/arcache"
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
result=$(bench_results write-path.txt)
header=$(bench_header "$secs")
bench_start arcache-wbench

origin_sock=$work/origin.sock
nbdkit --foreground --exit-with-parent -U "$origin_sock" --filter=delay --filter=rate \
  memory 2G rdelay=4ms wdelay=4ms rate=2400M & pids+=($!)
wait_sock "$origin_sock"
origin="nbd+unix:///?socket=$origin_sock"

arc_pid=
start_arcache() { # extra args...
  rm -f "$work/nbd.sock" "$work/ctl.sock"
  "$bin" serve --export "$origin" --arc-max 256M --listen "unix:$work/nbd.sock" --control "$work/ctl.sock" "$@" \
    2>>"$work/serve.log" & arc_pid=$!
  wait_sock "$work/nbd.sock"; wait_sock "$work/ctl.sock"
}
stop_arcache() { kill "$arc_pid"; wait "$arc_pid" || true; arc_pid=; }
arc="nbd+unix:///?socket=$work/nbd.sock"

fio_json() { # name uri json-out fio-args...
  local name=$1 uri=$2 json=$3; shift 3
  # A failed fio must not leave the JSON of an earlier job to be read.
  rm -f "$json"
  fio --name="$name" --ioengine=nbd --uri="$uri" --output-format=json --output="$json" "$@" >/dev/null 2>&1 ||
    { echo "bench: fio $name failed against $uri" >&2; return 1; }
}
field() { # json rw field
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0][sys.argv[2]]; print(round(j[sys.argv[3]]))' "$@"
}
randsync() { # label uri
  fio_json rs "$2" "$work/rs.json" --rw=randwrite --bs=4k --size=512M --iodepth=16 --fsync=1 \
    --time_based --runtime="$secs" --randseed=7 || return 1
  # `|| return 1`: called inside $(...), where set -e does not reach.
  local iops; iops=$(field "$work/rs.json" write iops) || return 1
  printf '%-44s %8s IOPS\n' "$1" "$iops" >&2
  echo "$iops"
}
seqwrite() { # uri -> MB/s
  fio_json sw "$1" "$work/sw.json" --rw=write --bs=1M --size=512M --iodepth=1 --end_fsync=1 || return 1
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(round(j["write"]["io_bytes"]/(j["job_runtime"]/1000)/1e6))' "$work/sw.json"
}
seqread() { # uri -> MB/s
  local bw
  fio_json sr "$1" "$work/sr.json" --rw=read --bs=1M --size=512M --iodepth=1 || return 1
  bw=$(field "$work/sr.json" read bw_bytes) || return 1
  echo $(( bw / 1000000 ))
}

echo "== 1. 4K random writes, QD16, FLUSH after each write ($secs s each)" >&2
o_iops=$(randsync "origin alone" "$origin")
start_arcache --set sync=always; w_iops=$(randsync "arcache write-through (sync=always, no log)" "$arc"); stop_arcache
start_arcache; n_iops=$(randsync "arcache, no log (FLUSH writes in place)" "$arc"); stop_arcache
start_arcache --log "$work/log.img:1G"
l_iops=$(randsync "arcache, log, sync=standard" "$arc")
"$bin" stat --json --control "$work/ctl.sock" > "$work/stat-log.json"
stop_arcache
start_arcache --log "$work/log.img:1G" --set sync=always
a_iops=$(randsync "arcache, log, sync=always" "$arc"); stop_arcache
# No durability at all: what this machine's CPUs allow the same job.
start_arcache --set sync=disabled --set zfs_txg_timeout=60
d_iops=$(randsync "arcache, sync=disabled (ceiling, unsafe)" "$arc"); stop_arcache

echo "== 2. seed 002: 1 MiB sequential writes of 512 MiB (2x ARC), then reads" >&2
o_w=$(seqwrite "$origin"); o_r1=$(seqread "$origin"); o_r=()
for i in 1 2 3; do o_r+=("$(seqread "$origin")"); done
start_arcache --log "$work/log.img:1G"
a_w=$(seqwrite "$arc")
"$bin" stat --json --control "$work/ctl.sock" > "$work/stat-seq.json"
stop_arcache
start_arcache --log "$work/log.img:1G"
a_r1=$(seqread "$arc"); a_r=()
for i in 1 2 3; do a_r+=("$(seqread "$arc")"); done
stop_arcache

ratio() { python3 -c "import sys; print(f'{float(sys.argv[1])/max(float(sys.argv[2]),1):.2f}x')" "$1" "$2"; }
# The rows take each ratio on its own line: a failed one stops the run
# (set -e, pipefail) instead of printing an empty figure, as it would
# inside printf's arguments.
iops_row() { # label iops: the figure, then vs write-through and vs origin
  local vs_w vs_o
  vs_w=$(ratio "$2" "$w_iops")
  vs_o=$(ratio "$2" "$o_iops")
  printf '  %-44s %8s IOPS  %8s %18s\n' "$1" "$2" "$vs_w" "$vs_o"
}
mbs_row() { # label without-cache with-cache: MB/s, then with / without
  local r
  r=$(ratio "$3" "$2")
  printf '  %-38s %13s MB/s %13s MB/s %8s\n' "$1" "$2" "$3" "$r"
}
{
  echo "$header"
  echo "origin: nbdkit memory + delay (rdelay=4ms wdelay=4ms) + rate (2400M); arcache --arc-max 256M, log 1 GiB file on local disk"
  echo
  echo "4K random writes, QD16, FLUSH after each write (fio --fsync=1)"
  printf '  %-44s %8s       %8s %18s\n' "" "" "vs write-through" "vs origin"
  printf '  %-44s %8s IOPS  %8s %18s\n' "origin alone" "$o_iops" "" "1.00x"
  vs_o=$(ratio "$w_iops" "$o_iops")
  printf '  %-44s %8s IOPS  %8s %18s\n' "arcache write-through (sync=always, no log)" "$w_iops" "1.00x" "$vs_o"
  iops_row "arcache, no log (FLUSH writes in place)" "$n_iops"
  iops_row "arcache, log, sync=standard" "$l_iops"
  iops_row "arcache, log, sync=always" "$a_iops"
  iops_row "arcache, sync=disabled (ceiling, unsafe)" "$d_iops"
  python3 - "$work/stat-log.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"  (log run: {s['zil_commit_count']} FLUSHes served by {s['zil_commit_writer_count']} log commits, "
      f"{s['zil_commit_us']} us of log IO per commit, {s['txg_syncs']} txgs, {s['zil_txg_fallbacks']} fallbacks)")
PY
  echo
  echo "Seed 002's sequence: 512 MiB (2x ARC) of 1 MiB writes at QD1 with a final fsync, then reads"
  printf '  %-38s %18s %18s %8s\n' "" "without cache" "with cache" "ratio"
  mbs_row "1. write" "$o_w" "$a_w"
  mbs_row "2. read after restart (cache dropped)" "$o_r1" "$a_r1"
  for i in 0 1 2; do
    mbs_row "3. read again, start $((i+1)) of 3" "${o_r[$i]}" "${a_r[$i]}"
  done
  python3 - "$work/stat-seq.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"  (write run: {s['txg_syncs']} txgs wrote {s['txg_sync_bytes']>>20} MiB, "
      f"throttle delays {s['throttle_delays']}, waits {s['throttle_waits']})")
PY
} | tee "$work/result.txt"
# Only a whole result replaces a published one.
bench_publish "$work/result.txt" "$result"
