#!/usr/bin/env bash
# Where the time of issue 22's "rsync between two directories inside the
# view" goes: on the slow source of bench/fileview.sh (ext4 on a direct-IO
# loop device over nbdfuse over `nbdkit --filter=delay rdelay=4ms
# wdelay=4ms`), holding fileview.sh's small-file tree (SMALL files of 1-8
# KB in 300 directories, made the same way: a directory's files are spread
# over the whole inode table, as in a tree filled over time), copying its
# first directory, each pass after
# `echo 3 > /proc/sys/vm/drop_caches`:
#   source      `rsync -a` of the directory to a new one beside it, on the source
#   write floor the same copy made from a copy in RAM (tmpfs) into the
#               source: what the source's own writes cost, the least a
#               write-through view can take
#   view first  through `arcache mount` just started (nothing cached)
#   view warm   through the same server again (its ARC warm)
#   view warm, --no-open-ahead  the same with open-ahead off (docs/fileview.md
#               section 8): each open then waits for its inode on SOURCE
# The copy is removed after each pass; ROUNDS rounds (default 3).
#
# Usage: bench/fileview-rsync-in.sh [ROUNDS [SMALL]]   (root; nbdkit, nbdfuse, rsync)
# Writes bench/results/fileview-rsync-in.md.
set -euo pipefail
rounds=${1:-3}
small=${2:-100000}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
bin=${ARCACHE_BIN:-$root/target/release/arcache}
for t in nbdkit nbdfuse rsync fusermount3 losetup mkfs.ext4 "$bin"; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "bench: needs root (loop devices, drop_caches)" >&2; exit 2; }
result=$(bench_results fileview-rsync-in.md)
header=$(bench_header "$@")
bench_start arcache-rsync-in
loop=
ram=/dev/shm/arcache-rsync-in.$$
cleanup_all() {
  ! mountpoint -q "$work/view" 2>/dev/null || fusermount3 -u "$work/view" 2>/dev/null || true
  umount "$work/slow" 2>/dev/null || true
  [ -z "$loop" ] || losetup -d "$loop" 2>/dev/null || true
  fusermount3 -u "$work/nbdf" 2>/dev/null || true
  rm -rf "$ram"
  bench_cleanup
}
trap cleanup_all EXIT

mkdir -p "$work/fill" "$work/slow" "$work/nbdf" "$work/view" "$ram"
img=$work/slow.img
truncate -s $((small * 12 * 1024 + (1 << 30))) "$img"
mkfs.ext4 -q -F "$img"
mount -o loop "$img" "$work/fill"
# The same generator and seed as fileview.sh's small files.
python3 - "$work/fill" "$small" <<'PY'
import os, random, sys
top, small = sys.argv[1], int(sys.argv[2])
rnd = random.Random(22)
for d in range(300):
    os.makedirs(f"{top}/small/d{d:03}", exist_ok=True)
for i in range(small):
    with open(f"{top}/small/d{i % 300:03}/f{i:06}.png", "wb") as f:
        f.write(rnd.randbytes(rnd.randint(1024, 8192)))
PY
cp -a "$work/fill/small/d000" "$ram/"
umount "$work/fill"
slow_source "$img"

declare -A t
timed() { # NAME CMD...
  local name=$1 s e
  shift
  sync
  echo 3 >/proc/sys/vm/drop_caches
  s=$(date +%s.%N)
  "$@" >/dev/null
  e=$(date +%s.%N)
  t[$name]="${t[$name]:-}$(python3 -c "print(f'{$e - $s:.2f}')") "
  echo "bench: $name $(python3 -c "print(f'{$e - $s:.2f}')") s" >&2
}
copy() { rsync -a "$1/" "$2/"; rm -rf "$2"; }
view() { # NAME [ARGS]: a server just started, then warm
  local name=$1
  shift
  "$bin" mount "$work/slow" "$work/view" --arc-max 1G --control "$work/ctl.sock" "$@" 2>"$work/view.log" & pids+=($!)
  for _ in $(seq 200); do mountpoint -q "$work/view" && break; sleep 0.05; done
  timed "$name-first" copy "$work/view/small/d000" "$work/view/small/copy"
  timed "$name-warm" copy "$work/view/small/d000" "$work/view/small/copy"
  fusermount3 -u "$work/view"
  wait "${pids[-1]}" || true
}
for r in $(seq "$rounds"); do
  timed source copy "$work/slow/small/d000" "$work/slow/small/copy"
  timed floor copy "$ram/d000" "$work/slow/small/copy"
  view view
  view noahead --no-open-ahead
  echo "bench: round $r done" >&2
done
{
  echo "$header"
  echo
  echo "bench/fileview.sh's slow source holding its small-file tree ($small files of 1-8 KB in 300 directories); \`rsync -a\` of the first directory ($(ls "$ram/d000" | wc -l) files) to a new directory beside it; kernel caches dropped before every pass; seconds, one figure per round:"
  echo
  echo "| pass | seconds |"
  echo "|---|---|"
  echo "| on the source itself | ${t[source]}|"
  echo "| from a copy in RAM into the source (the source's writes alone) | ${t[floor]}|"
  echo "| through arcache mount, just started | ${t[view-first]}|"
  echo "| through arcache mount, again (ARC warm) | ${t[view-warm]}|"
  echo "| through arcache mount --no-open-ahead, just started | ${t[noahead-first]}|"
  echo "| through arcache mount --no-open-ahead, again (ARC warm) | ${t[noahead-warm]}|"
} >"$result"
cat "$result"
