#!/usr/bin/env bash
# Issue 22, item 3: what each kernel-side cache setting of `arcache mount`
# buys. The source is a local directory on this machine's disk (fast): the
# passes measure the kernel and FUSE side, with the view's ARC warm in
# every configuration. Each setting is compared with the default in the
# same run, pass for pass:
#
#   keep_cache    `cat` of every data file, twice, without dropping the
#                 kernel's caches: the second pass with the default (the
#                 kernel keeps its pages of unchanged files) and with
#                 --no-keep-cache (every open drops them).
#   readdirplus   `find -ls` of the small-file tree after dropping the
#                 kernel's dentries and inodes (`echo 2 > drop_caches`; the
#                 view's ARC stays warm): with the default (attributes come
#                 with the listing) and with --no-readdirplus (one lookup
#                 per name).
#   entry/attr    `find -ls`, twice, without dropping caches: the kernel
#   lifetimes     keeps entries and attributes for --revalidate seconds
#                 (default 1); 0 has it ask the view at every use (and
#                 the view ask SOURCE: the two go together), 60
#                 keeps them for a minute.
#
# Large reads (max_readahead is the view's recordsize, 128K) are not
# varied: fuser offers no switch for the kernel's read size.
#
# Usage: bench/fileview-kernel.sh [SMALL_FILES] [DATA_FILES]
#   (default 20000 files of 1-8 KB in 100 directories, 2000 files of 128 KB)
# Needs root (drop_caches). Writes bench/results/fileview-kernel.md.
set -euo pipefail
shopt -s inherit_errexit
small=${1:-20000}
data=${2:-2000}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
bin=${ARCACHE_BIN:-$root/target/release/arcache}
[ -x "$bin" ] || { echo "bench: $bin is missing (cargo build --release)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bench: needs root (drop_caches)" >&2; exit 2; }
result=$(bench_results fileview-kernel.md)
header=$(bench_header "$small" "$data")
bench_start arcache-fileview-kernel
src=$work/src
mkdir -p "$src/small" "$src/data" "$work/view"
echo "bench: making $small small files and $data data files" >&2
python3 - "$src" "$small" "$data" <<'EOF'
import os, random, sys
src, small, data = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1)
for i in range(small):
    d = f"{src}/small/d{i % 100:03d}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{i:06d}", "wb") as f:
        f.write(rng.randbytes(rng.randint(1024, 8192)))
for i in range(data):
    with open(f"{src}/data/p{i:05d}.png", "wb") as f:
        f.write(rng.randbytes(128 << 10))
EOF
ctl=$work/ctl.sock
view_pid=
start_view() {
  "$bin" mount "$src" "$work/view" --control "$ctl" --arc-max 2G "$@" >"$work/view.log" 2>&1 &
  view_pid=$!
  pids+=("$view_pid")
  for _ in $(seq 400); do [ -S "$ctl" ] && mountpoint -q "$work/view" && return 0; sleep 0.05; done
  cat "$work/view.log" >&2; echo "bench: arcache mount did not come up" >&2; exit 1
}
stop_view() {
  kill -TERM "$view_pid"
  wait "$view_pid" || { cat "$work/view.log" >&2; exit 1; }
}
# secs CMD...: runs CMD, prints its wall time in seconds.
secs() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.3f}')"
}
cat_all() { find "$work/view/data" -type f -exec cat {} + >/dev/null; }
find_ls() { find "$work/view/small" -ls >/dev/null; }
declare -A t
run() { # NAME ARGS...: one configuration, its passes
  local name=$1
  shift
  start_view "$@"
  # Fills the view's ARC (not timed).
  cat_all; find_ls
  sync; echo 3 >/proc/sys/vm/drop_caches
  cat_all
  t[$name-cat]=$(secs cat_all)
  echo 2 >/proc/sys/vm/drop_caches
  t[$name-find-cold]=$(secs find_ls)
  t[$name-find-again]=$(secs find_ls)
  echo "bench: $name: cat again ${t[$name-cat]} s, find after dropping dentries ${t[$name-find-cold]} s, find again ${t[$name-find-again]} s" >&2
  stop_view
}
run default
run no-keep-cache --no-keep-cache
run no-readdirplus --no-readdirplus
run revalidate-0 --revalidate 0
run revalidate-60 --revalidate 60
ratio() { python3 -c "print(f'{$1 / $2:.2f}x')"; }
# Each ratio on its own line: a failed one stops the run (set -e) instead
# of leaving an empty figure in the result, as it would inside echo's arguments.
{
  echo "$header"
  echo
  echo "Source: a local directory (this machine's disk); $small files of 1-8 KB in 100 directories, $data files of 128 KB. \`arcache mount --arc-max 2G\`, the view's ARC warm in every row."
  echo
  echo "| configuration | cat of the data files again (s) | find -ls after dropping dentries (s) | find -ls again (s) |"
  echo "|---|---:|---:|---:|"
  for c in default no-keep-cache no-readdirplus revalidate-0 revalidate-60; do
    echo "| $c | ${t[$c-cat]} | ${t[$c-find-cold]} | ${t[$c-find-again]} |"
  done
  echo
  echo "What each buys (the other configuration's time over the default's; above 1 means the default is faster):"
  echo
  keep_cache=$(ratio "${t[no-keep-cache-cat]}" "${t[default-cat]}")
  echo "- keep_cache: a repeated cat $keep_cache (--no-keep-cache vs default)"
  readdirplus=$(ratio "${t[no-readdirplus-find-cold]}" "${t[default-find-cold]}")
  echo "- readdirplus: find -ls after dropping dentries $readdirplus (--no-readdirplus vs default)"
  revalidate_0=$(ratio "${t[revalidate-0-find-again]}" "${t[default-find-again]}")
  revalidate_60=$(ratio "${t[revalidate-60-find-again]}" "${t[default-find-again]}")
  echo "- entry/attribute lifetimes: find -ls again $revalidate_0 (--revalidate 0 vs 1); --revalidate 60 vs 1: $revalidate_60"
} >"$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
cat "$result"
