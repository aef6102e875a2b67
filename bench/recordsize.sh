#!/usr/bin/env bash
# Small IO on large records, in one run: for each recordsize (16K, 128K,
# 1M), arcache serves the same 256 MiB half-compressible file with every
# record cached (read once whole first), then fio's nbd engine does 4K
# random reads and 4K random writes at QD16. Reports IOPS and each
# recordsize's ratio to 16K, and what a larger record costs on a miss: bytes
# read from the backing store per byte a cold 4K random read asked for.
#
# Usage: bench/recordsize.sh [SECONDS_PER_JOB [ROUNDS]]   (about 3 minutes at 8 3)
# Writes bench/results/recordsize.md (commit and date on its first line).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-8}
rounds=${2:-3}
size_mib=256
for t in fio nbdcopy python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (apt-get install fio libnbd-bin)" >&2; exit 2; }
done
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
cargo build --release --quiet --manifest-path "$here/Cargo.toml"
bin="$here/target/release/arcache"
bench_start arcache-recordsize
result=$(bench_results recordsize.md)
header=$(bench_header "$secs" "$rounds")

# Half-compressible data, as fio writes it: compression is on by default and
# a compressed record is what used to be decompressed whole for each read.
img="$work/disk.img"
fio --name=fill --filename="$img" --rw=write --bs=1M --size=${size_mib}M \
    --buffer_compress_percentage=50 --refill_buffers --output=/dev/null

stat_field() { "$bin" stat --json --control "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"; }

fio_iops() { # uri rw -> IOPS
  # The nbd engine prints a line of its own on stdout: JSON goes to a file.
  fio --name=j --ioengine=nbd --uri="$1" --rw="$2" --bs=4k --iodepth=16 --size=${size_mib}M \
      --time_based --runtime="$secs" --randseed=42 --buffer_compress_percentage=50 \
      --output-format=json --output="$work/fio.json" >/dev/null
  python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0]; print(round(j['read']['iops'] + j['write']['iops']))" "$work/fio.json"
}

declare -A reads writes amp hdr warm_mib hot_mib uri ctl
# All three servers run side by side and the jobs take turns, ROUNDS times,
# so a slow phase of this shared machine hits every record size alike; each
# figure is the median of its rounds.
for rs in 16K 128K 1M; do
  sock="$work/$rs.sock" ctl[$rs]="$work/$rs.ctl"
  cp --sparse=never "$img" "$work/$rs.img"
  "$bin" serve --export "$work/$rs.img" --recordsize "$rs" --listen "unix:$sock" --control "${ctl[$rs]}" \
    --arc-max 1G >"$work/$rs.log" 2>&1 & pids+=($!)
  wait_sock "$sock"; wait_sock "${ctl[$rs]}"
  uri[$rs]="nbd+unix:///?socket=$sock"
  # Cold 4K random reads: what a miss costs at this recordsize.
  b0=$(stat_field "${ctl[$rs]}" backing_read_bytes)
  fio --name=cold --ioengine=nbd --uri="${uri[$rs]}" --rw=randread --bs=4k --iodepth=1 --size=${size_mib}M \
      --number_ios=512 --randseed=7 --output=/dev/null >/dev/null
  b1=$(stat_field "${ctl[$rs]}" backing_read_bytes)
  amp[$rs]=$(python3 -c "print(f'{($b1 - $b0) / (512 * 4096):.1f}')")
  nbdcopy "${uri[$rs]}" null:      # every record cached, whole
  records=$(( (size_mib << 20) / $(numfmt --from=iec "$rs") ))
  hdr[$rs]=$(( $(stat_field "${ctl[$rs]}" hdr_size) / records ))
  warm_mib[$rs]=$(( $(stat_field "${ctl[$rs]}" data_size) >> 20 ))
done
median() { python3 -c "import statistics,sys; print(round(statistics.median(map(float, sys.argv[1:]))))" "$@"; }
declare -A read_runs write_runs
for round in $(seq "$rounds"); do
  for rs in 16K 128K 1M; do read_runs[$rs]+=" $(fio_iops "${uri[$rs]}" randread)"; done
  for rs in 16K 128K 1M; do write_runs[$rs]+=" $(fio_iops "${uri[$rs]}" randwrite)"; done
  echo "round $round: reads ${read_runs[16K]##* } / ${read_runs[128K]##* } / ${read_runs[1M]##* }, writes ${write_runs[16K]##* } / ${write_runs[128K]##* } / ${write_runs[1M]##* }" >&2
done
for rs in 16K 128K 1M; do
  # shellcheck disable=SC2086
  reads[$rs]=$(median ${read_runs[$rs]})
  # shellcheck disable=SC2086
  writes[$rs]=$(median ${write_runs[$rs]})
  # Records read or written in part are kept plain (decompressed) while hot.
  hot_mib[$rs]=$(( $(stat_field "${ctl[$rs]}" data_size) >> 20 ))
done

ratio() { python3 -c "print(f'{$1 / $2:.2f}x')"; }
# The ratios are worked out first: a failed $(...) in echo's arguments
# would not stop the script under set -e.
declare -A read_vs write_vs
for rs in 16K 128K 1M; do
  read_vs[$rs]=$(ratio "${reads[$rs]}" "${reads[16K]}")
  write_vs[$rs]=$(ratio "${writes[$rs]}" "${writes[16K]}")
done
{
  echo "$header"
  echo
  echo "256 MiB half-compressible file, every record cached (ARC 1 GiB), fio nbd engine, 4K at QD16, ${secs} s per job; IOPS are medians of $rounds rounds in which the three servers took turns."
  echo
  for rs in 16K 128K 1M; do echo "- $rs: reads${read_runs[$rs]}; writes${write_runs[$rs]}"; done
  echo
  echo "| recordsize | 4K random read IOPS | vs 16K | 4K random write IOPS | vs 16K | backing bytes per byte asked, 512 cold 4K reads | ARC header bytes per record | ARC data MiB after a whole read (compressed) | after the 4K jobs (hot records plain) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for rs in 16K 128K 1M; do
    echo "| $rs | ${reads[$rs]} | ${read_vs[$rs]} | ${writes[$rs]} | ${write_vs[$rs]} | ${amp[$rs]}x | ${hdr[$rs]} | ${warm_mib[$rs]} | ${hot_mib[$rs]} |"
  done
} > "$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
cat "$result"
