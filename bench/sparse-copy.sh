#!/usr/bin/env bash
# nbdcopy through arcache, a 1 GiB image holding 64 MiB of data against a
# dense 1 GiB one, each from a cold cache: block status lets nbdcopy skip
# the holes. Also the same copy with block status hidden from nbdcopy
# (--no-extents), which reads every byte.
#
# Usage: bench/sparse-copy.sh   (under a minute)
# Writes bench/results/sparse-copy.md (commit and date first).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
command -v nbdcopy >/dev/null || { echo "bench: apt-get install libnbd-bin" >&2; exit 2; }
cargo build --release --quiet --manifest-path "$here/Cargo.toml"
bin="$here/target/release/arcache"
bench_start arcache-sparse
result=$(bench_results sparse-copy.md)
header=$(bench_header)

truncate -s 1G "$work/sparse.img"
for i in $(seq 0 15); do   # 16 pieces of 4 MiB, 64 MiB apart
  dd if=/dev/urandom of="$work/sparse.img" bs=4M count=1 seek=$((i * 16)) conv=notrunc status=none
done
head -c 1G /dev/urandom > "$work/dense.img"

copy_secs() { # image [nbdcopy options...] -> seconds, from a fresh server (cold cache)
  local img=$1; shift
  "$bin" serve --export "$img" --listen "unix:$work/s.sock" --control "$work/c.sock" --arc-max 256M \
    >"$work/serve.log" 2>&1 & pids+=($!)
  wait_sock "$work/s.sock"
  local t0 t1
  t0=$(date +%s.%N)
  nbdcopy "$@" "nbd+unix:///?socket=$work/s.sock" null:
  t1=$(date +%s.%N)
  kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
  rm -f "$work/s.sock" "$work/c.sock"
  python3 -c "print(f'{$t1 - $t0:.2f}')"
}

sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
sparse=$(copy_secs "$work/sparse.img")
sparse_all=$(copy_secs "$work/sparse.img" --no-extents)
dense=$(copy_secs "$work/dense.img")
# The ratios are worked out first: a failed $(...) in echo's arguments
# would not stop the script under set -e.
sparse_vs=$(python3 -c "print(f'{$sparse / $dense:.2f}x')")
sparse_all_vs=$(python3 -c "print(f'{$sparse_all / $dense:.2f}x')")
{
  echo "$header"
  echo
  echo "nbdcopy from arcache (cold, --arc-max 256M, file backing) to null:"
  echo
  echo "| image | seconds | vs dense |"
  echo "|---|---|---|"
  echo "| 1 GiB, 64 MiB of data, block status used | $sparse | $sparse_vs |"
  echo "| the same image, nbdcopy --no-extents | $sparse_all | $sparse_all_vs |"
  echo "| 1 GiB dense | $dense | 1.00x |"
} > "$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
cat "$result"
