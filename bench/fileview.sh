#!/usr/bin/env bash
# Issue 22's figures: a seed-001-like tree on a slow source, read through
# `arcache mount`, against the source itself, `rclone mount
# --vfs-cache-mode full` over the same source, and bindfs over a copy in
# RAM (the cost of FUSE alone). The kernel's caches are dropped before
# every pass (`echo 3 > /proc/sys/vm/drop_caches`), so a warm pass is warm
# only in the cache under test.
#
# The slow source is the recipe of the shared notes: ext4 on a loop device
# (direct IO, no read-ahead) over nbdfuse over `nbdkit --filter=delay
# rdelay=4ms wdelay=4ms`, so every block the kernel reads from it costs
# 4 ms, like a seek on an HDD.
#
# Passes, each timed:
#   rsync   `rsync -a --dry-run` of the small-file tree into an empty dir
#   find    `find -ls` of the small-file tree
#   rsync-in `rsync -a` of one small-file directory to a new one beside it,
#           inside the mount (issue 22's "rsync between two directories")
#   cp      `cp -r` of the data set to tmpfs (reading, not writing, is
#           measured), in MB/s. Cold, the source reads about 1 MB/s (every
#           4K block 4 ms), so a cold cp of the whole set would take most of
#           an hour: cold passes copy DATA_SAMPLE of the 50 data directories
#           (default 5), warm ones all 50. The caches are first filled by
#           reading every data file with 16 readers at once (`warmup`,
#           timed), which is also how a cold cp of the whole set through
#           them would fill them.
# arcache runs with --revalidate R (default 1, the mount's default: every
# object older than R seconds is checked against the source with one
# lstat before use); ARCACHE_REVALIDATE=600 shows a long window.
#
# Usage: bench/fileview.sh [SMALL_FILES] [DATA_FILES]
#   (default 100000 files of 1-8 KB in 300 directories, 10000 files of
#   50-200 KB in 50 directories, as issue 22 asks)
# Needs root (loop devices, drop_caches), nbdkit, nbdfuse, rclone, bindfs,
# rsync, fusermount3.
# Writes bench/results/fileview.md (fileview-rR.md for another window).
set -euo pipefail
shopt -s inherit_errexit
small=${1:-100000}
data=${2:-10000}
sample=${DATA_SAMPLE:-5}
reval=${ARCACHE_REVALIDATE:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
bin=${ARCACHE_BIN:-$root/target/release/arcache}
for t in nbdkit nbdfuse rclone bindfs rsync fusermount3 losetup mkfs.ext4 "$bin"; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "bench: needs root (loop devices, drop_caches)" >&2; exit 2; }
if [ "$reval" = 1 ]; then result=$(bench_results fileview.md); else result=$(bench_results "fileview-r$reval.md"); fi
header=$(bench_header "$small" "$data")
[ "$reval" = 1 ] || header="$header, ARCACHE_REVALIDATE=$reval"
bench_start arcache-fileview
mounts=()
loop=
cleanup_all() {
  local i m
  for m in "$work/view" "$work/rclone" "$work/bindfs"; do
    ! mountpoint -q "$m" 2>/dev/null || fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[$i]}" 2>/dev/null || fusermount3 -u "${mounts[$i]}" 2>/dev/null || umount -l "${mounts[$i]}" 2>/dev/null || true
  done
  [ -z "$loop" ] || losetup -d "$loop" 2>/dev/null || true
  fusermount3 -u "$work/nbdf" 2>/dev/null || true
  bench_cleanup
}
trap cleanup_all EXIT

echo "bench: making the tree ($small small files, $data data files)" >&2
img=$work/slow.img
truncate -s $(((small * 12 + data * 220) * 1024 + (1 << 30))) "$img"
mkfs.ext4 -q -F "$img"
mkdir -p "$work/fill" "$work/slow" "$work/nbdf" "$work/view" "$work/rclone" "$work/bindfs"
mount -o loop "$img" "$work/fill"
# make_tree DIR: the tree, the same bytes every time (a fixed seed).
make_tree() {
  python3 - "$1" "$small" "$data" <<'EOF'
import os, random, sys
top, small, data = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(22)
def fill(sub, count, dirs, lo, hi):
    for d in range(dirs):
        os.makedirs(f"{top}/{sub}/d{d:03}", exist_ok=True)
    for i in range(count):
        with open(f"{top}/{sub}/d{i % dirs:03}/f{i:06}.png", "wb") as f:
            f.write(rnd.randbytes(rnd.randint(lo, hi)))
fill("small", small, 300, 1024, 8192)
fill("data", data, 50, 50 * 1024, 200 * 1024)
EOF
}
make_tree "$work/fill"
umount "$work/fill"

slow_source "$img"
mounts+=("$work/slow")
src=$work/slow

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
declare -A t
# timed NAME CMD...: runs CMD after dropping the kernel's caches; its
# wall time in seconds goes to t[NAME].
timed() {
  local name=$1 s e
  shift
  drop
  s=$(date +%s.%N)
  "$@" >/dev/null
  e=$(date +%s.%N)
  t[$name]=$(python3 -c "print(f'{$e - $s:.2f}')")
  echo "bench: $name ${t[$name]} s" >&2
}
rsync_pass() { rm -rf "$work/dst" && mkdir "$work/dst" && rsync -a --dry-run "$1/small/" "$work/dst/"; }
find_pass() { find "$1/small" -ls; }
# An rsync between two directories inside the tree (reads the files of one
# small-file directory, writes them beside it); the copy is removed after.
rsync_in_pass() { rsync -a "$1/small/d000/" "$1/small-copy/"; }
rsync_in() { # PREFIX DIR
  timed "$1-rsync-in" rsync_in_pass "$2"
  rm -rf "$2/small-copy"
}
cpdst=/dev/shm/arcache-fileview-cp
# cp_pass DIR DIRS...: copies DIR/data/DIRS to tmpfs.
cp_pass() {
  local from=$1 d
  shift
  rm -rf "$cpdst" && mkdir "$cpdst"
  for d in "$@"; do cp -r "$from/data/$d" "$cpdst/"; done
  rm -rf "$cpdst"
}
data_dirs() { (cd "$src/data" && ls | head -n "$1"); }
# cp_rate NAME DIR COUNT: a timed cp of the first COUNT data directories, as MB/s.
cp_rate() {
  local bytes
  # shellcheck disable=SC2046
  bytes=$(cd "$src/data" && du -sb --apparent-size $(data_dirs "$3") | awk '{s += $1} END {print s}')
  # shellcheck disable=SC2046
  timed "$1-cp-s" cp_pass "$2" $(data_dirs "$3")
  t[$1-cp]=$(python3 -c "print(f'{$bytes / 1e6 / ${t[$1-cp-s]}:.1f}')")
  echo "bench: $1-cp ${t[$1-cp]} MB/s" >&2
}
warmup() { (cd "$1/data" && find . -type f -print0 | xargs -0 -n 20 -P 16 cat >/dev/null); }
passes() { # PREFIX DIR cold|warm
  timed "$1-rsync" rsync_pass "$2"
  timed "$1-find" find_pass "$2"
  rsync_in "$1" "$2"
  if [ "$3" = cold ]; then
    cp_rate "$1" "$2" "$sample"
  else
    cp_rate "$1" "$2" 50
  fi
}

echo "bench: the source alone, cold" >&2
passes source "$src" cold

# The least a pass after a restart can cost under the revalidation rule
# (every file checked on the source by one lstat before its restored
# records are used): the names known in advance, 32 lstats at once.
find "$src/small" -type f >"$work/small.list"
lstat_all() {
  python3 - "$1" <<'PY'
import os, sys
from concurrent.futures import ThreadPoolExecutor
paths = open(sys.argv[1]).read().split("\n")[:-1]
with ThreadPoolExecutor(32) as pool:
    n = sum(1 for _ in pool.map(os.lstat, paths))
print(n)
PY
}
timed source-lstat-floor lstat_all "$work/small.list"

# arcache: an ARC that holds the whole set and an L2 file for the restart.
ctl=$work/arcache.sock
start_arcache() { # [fresh]: with a new, empty L2 file
  [ "${1:-}" != fresh ] || rm -f "$work/l2.img"
  "$bin" mount "$src" "$work/view" --control "$ctl" --arc-max 4G --l2 "$work/l2.img:4G" \
    --revalidate "$reval" >"$work/arcache.log" 2>&1 & pids+=($!)
  arcache_pid=$!
  for _ in $(seq 400); do [ -S "$ctl" ] && mountpoint -q "$work/view" && return 0; sleep 0.05; done
  cat "$work/arcache.log" >&2; echo "bench: arcache mount did not come up" >&2; exit 1
}
# Waits for the L2 rebuild of a restarted server; its time goes to t[NAME].
wait_rebuild() {
  for _ in $(seq 1200); do [ "$(stat_field l2_rebuild_running)" = 0 ] && break; sleep 0.1; done
  t[$1]=$(stat_field l2_rebuild_ms)
}
# Waits until the L2 feed has written what it will (its size still for
# 5 s, its log committed; at most 10 minutes).
wait_feed() { wait_l2_feed 5 600; }
stop_arcache() {
  kill -TERM "$arcache_pid"
  wait "$arcache_pid" || { cat "$work/arcache.log" >&2; echo "bench: arcache mount failed" >&2; exit 1; }
}
stat_field() { "$bin" stat --json --control "$ctl" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
# meta NAME CMD...: runs CMD; the demand metadata hit ratio over it goes to t[NAME-meta].
meta() {
  local name=$1 h0 m0 h1 m1
  shift
  h0=$(stat_field demand_metadata_hits); m0=$(stat_field demand_metadata_misses)
  "$@"
  h1=$(stat_field demand_metadata_hits); m1=$(stat_field demand_metadata_misses)
  t[$name-meta]=$(python3 -c "h,m=$h1-$h0,$m1-$m0; print(f'{100*h/(h+m):.1f} % of {h+m}' if h+m else 'n/a')")
  echo "bench: $name demand metadata hits ${t[$name-meta]}" >&2
}
echo "bench: arcache mount, cold (a new server with an empty L2 for each pass)" >&2
start_arcache fresh; meta arc-cold-rsync timed arc-cold-rsync rsync_pass "$work/view"; stop_arcache
start_arcache fresh; meta arc-cold-find timed arc-cold-find find_pass "$work/view"; stop_arcache
start_arcache fresh; cp_rate arc-cold "$work/view" "$sample"; stop_arcache
start_arcache fresh; rsync_in arc-cold "$work/view"; stop_arcache
echo "bench: arcache mount, warm" >&2
start_arcache fresh
rsync_pass "$work/view" >/dev/null
find_pass "$work/view" >/dev/null
timed arc-warmup warmup "$work/view"
rsync_in arc-first "$work/view"
meta arc-warm-rsync timed arc-warm-rsync rsync_pass "$work/view"
meta arc-warm-find timed arc-warm-find find_pass "$work/view"
cp_rate arc-warm "$work/view" 50
rsync_in arc-warm "$work/view"
t[arc-meta-used]=$(stat_field arc_meta_used)
wait_feed
t[arc-l2-size]=$(stat_field l2_size)
echo "bench: arcache mount, after a restart (the same L2; restarted before each pass)" >&2
stop_arcache; start_arcache; wait_rebuild arc-rebuild-ms
meta arc-restart-rsync timed arc-restart-rsync rsync_pass "$work/view"
stop_arcache; start_arcache; wait_rebuild arc-rebuild-ms-2
meta arc-restart-find timed arc-restart-find find_pass "$work/view"
stop_arcache; start_arcache; wait_rebuild arc-rebuild-ms-3
cp_rate arc-restart "$work/view" "$sample"
stop_arcache; start_arcache; wait_rebuild arc-rebuild-ms-4
rsync_in arc-restart "$work/view"
stop_arcache

echo "bench: rclone mount --vfs-cache-mode full" >&2
start_rclone() { # [fresh]: with an empty cache directory
  [ "${1:-}" != fresh ] || rm -rf "$work/rclone-cache"
  rclone mount "$src" "$work/rclone" --vfs-cache-mode full --cache-dir "$work/rclone-cache" \
    --vfs-cache-max-size 8G >"$work/rclone.log" 2>&1 & pids+=($!)
  for _ in $(seq 400); do mountpoint -q "$work/rclone" && return 0; sleep 0.05; done
  cat "$work/rclone.log" >&2; echo "bench: rclone did not mount" >&2; exit 1
}
stop_rclone() { fusermount3 -u "$work/rclone"; sleep 0.5; }
start_rclone fresh; timed rclone-cold-rsync rsync_pass "$work/rclone"; stop_rclone
start_rclone fresh; timed rclone-cold-find find_pass "$work/rclone"; stop_rclone
start_rclone fresh; cp_rate rclone-cold "$work/rclone" "$sample"; stop_rclone
start_rclone fresh; rsync_in rclone-cold "$work/rclone"; stop_rclone
start_rclone fresh
rsync_pass "$work/rclone" >/dev/null
find_pass "$work/rclone" >/dev/null
timed rclone-warmup warmup "$work/rclone"
rsync_in rclone-first "$work/rclone"
passes rclone-warm "$work/rclone" warm
stop_rclone

echo "bench: bindfs over a copy in RAM" >&2
# Made again in RAM from the same seed: copying it off the slow source
# would take most of an hour.
ram=/dev/shm/arcache-fileview-ram
rm -rf "$ram"
make_tree "$ram"
bindfs "$ram" "$work/bindfs"
mounts+=("$work/bindfs")
passes bindfs "$work/bindfs" warm
fusermount3 -u "$work/bindfs"
unset 'mounts[-1]'
rm -rf "$ram"

ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}x' if b else 'n/a')" "$1" "$2"; }
# Each ratio is taken on its own line: a failed one then stops the run
# (set -e), where inside echo's arguments it would print an empty figure.
{
  echo "$header"
  echo
  echo "Tree: $small files of 1-8 KB in 300 directories (rsync, find), $data files of 50-200 KB in 50 directories (cp)."
  echo "Source: ext4 on a direct-IO loop device over nbdfuse over nbdkit --filter=delay rdelay=4ms wdelay=4ms."
  echo "arcache: \`arcache mount --arc-max 4G --l2 FILE:4G --revalidate $reval\`; kernel caches dropped before every pass."
  echo
  echo "Seconds per pass (lower is better); cp in MB/s (higher is better; cold passes copy $sample of the 50 data directories, warm ones all):"
  echo
  echo "| pass | source cold | arcache cold | arcache warm | arcache after restart | rclone cold | rclone warm | bindfs over RAM |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  for p in rsync find rsync-in cp; do
    [ "$p" = cp ] && echo "| warm-up: every data file read, 16 at once (s) | | | ${t[arc-warmup]} | | | ${t[rclone-warmup]} | |"
    echo "| $p | ${t[source-$p]} | ${t[arc-cold-$p]} | ${t[arc-warm-$p]} | ${t[arc-restart-$p]} | ${t[rclone-cold-$p]} | ${t[rclone-warm-$p]} | ${t[bindfs-$p]} |"
  done
  echo
  floor_rsync=$(ratio "${t[source-rsync]}" "${t[source-lstat-floor]}")
  floor_find=$(ratio "${t[source-find]}" "${t[source-lstat-floor]}")
  echo "The floor for a pass after a restart: one lstat of every file of the small-file tree on the source, 32 at once, names known in advance, caches dropped: ${t[source-lstat-floor]} s, so a view that checks every file after a restart can make rsync at most $floor_rsync and find at most $floor_find faster than the source's cold pass (more only by trusting restored attributes unchecked)."
  echo
  echo "Speed-ups of arcache (time of the other / arcache's):"
  echo
  echo "| pass | warm vs source cold | warm vs rclone warm | warm vs bindfs over RAM | after restart vs source cold |"
  echo "|---|---:|---:|---:|---:|"
  for p in rsync find rsync-in; do
    vs_source=$(ratio "${t[source-$p]}" "${t[arc-warm-$p]}")
    vs_rclone=$(ratio "${t[rclone-warm-$p]}" "${t[arc-warm-$p]}")
    vs_bindfs=$(ratio "${t[bindfs-$p]}" "${t[arc-warm-$p]}")
    restart_vs_source=$(ratio "${t[source-$p]}" "${t[arc-restart-$p]}")
    echo "| $p | $vs_source | $vs_rclone | $vs_bindfs | $restart_vs_source |"
  done
  vs_source=$(ratio "${t[arc-warm-cp]}" "${t[source-cp]}")
  vs_rclone=$(ratio "${t[arc-warm-cp]}" "${t[rclone-warm-cp]}")
  vs_bindfs=$(ratio "${t[arc-warm-cp]}" "${t[bindfs-cp]}")
  restart_vs_source=$(ratio "${t[arc-restart-cp]}" "${t[source-cp]}")
  echo "| cp (MB/s) | $vs_source | $vs_rclone | $vs_bindfs | $restart_vs_source |"
  echo
  echo "arcache's demand metadata hit ratio (demand_metadata_hits / (hits + misses) over the pass):"
  echo
  echo "| pass | cold | warm | after restart |"
  echo "|---|---:|---:|---:|"
  for p in rsync find; do
    echo "| $p | ${t[arc-cold-$p-meta]} | ${t[arc-warm-$p-meta]} | ${t[arc-restart-$p-meta]} |"
  done
  echo
  echo "After the warm passes: arc_meta_used ${t[arc-meta-used]} bytes; l2_size ${t[arc-l2-size]} bytes once the L2 feed had settled (its size still for 5 s, its log committed)."
  echo "L2 rebuild after each restart, before the pass: ${t[arc-rebuild-ms]}, ${t[arc-rebuild-ms-2]}, ${t[arc-rebuild-ms-3]}, ${t[arc-rebuild-ms-4]} ms."
  echo
  echo "Cold columns: a new server (arcache: an empty L2; rclone: an empty cache directory) for each pass."
  echo "Warm columns: one server that has done every pass once and read every data file (the warm-up row)."
  echo "After restart: arcache stopped (SIGTERM) and started again on the same L2 file before each pass; the pass starts once the L2 rebuild (restoring the index of what the L2 holds) has ended. Every file is checked against the source (one lstat) before its restored records are used."
  echo "rsync-in: \`rsync -a\` of one directory of the small-file tree (333 files at full size) to a new directory beside it, inside the mount (reads there, writes through to the source); the copy is removed after each pass. The warm column's server had done it once before."
} >"$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
cat "$result"
