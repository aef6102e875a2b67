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
#   view after restart  the same server stopped and started again on its
#               persistent L2 file (the pass starts once the rebuild ended)
#   view warm, --no-deferred-open  every open goes to SOURCE before it is
#               answered (docs/fileview.md section 4, "inotify"), as before
#               deferred opens; open-ahead (section 8) reads the inodes ahead
#   view warm, --no-deferred-open --no-open-ahead  each open then waits for
#               its inode on SOURCE
#   bindfs over RAM  the copy inside a bindfs mount of the RAM copy: what
#               FUSE alone costs, the least any FUSE view can take
#   check floor one lstat of each of the directory's files on the source,
#               32 at once, names known in advance: the least a view that
#               checks every file before using what it restored (after a
#               restart) or opens every file on SOURCE can take
# The copy is removed after each pass; ROUNDS rounds (default 3).
#
# Usage: bench/fileview-rsync-in.sh [ROUNDS [SMALL]]   (root; nbdkit, nbdfuse, rsync, bindfs)
# Writes bench/results/fileview-rsync-in.md.
set -euo pipefail
rounds=${1:-3}
small=${2:-100000}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
bin=${ARCACHE_BIN:-$root/target/release/arcache}
for t in nbdkit nbdfuse rsync bindfs fusermount3 losetup mkfs.ext4 "$bin"; do
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
  ! mountpoint -q "$work/bind" 2>/dev/null || fusermount3 -u "$work/bind" 2>/dev/null || true
  umount "$work/slow" 2>/dev/null || true
  [ -z "$loop" ] || losetup -d "$loop" 2>/dev/null || true
  fusermount3 -u "$work/nbdf" 2>/dev/null || true
  rm -rf "$ram"
  bench_cleanup
}
trap cleanup_all EXIT

mkdir -p "$work/fill" "$work/slow" "$work/nbdf" "$work/view" "$work/bind" "$ram"
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
ls "$ram/d000" >"$work/names"
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
ctl=$work/ctl.sock
stat_field() { "$bin" stat --json --control "$ctl" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
mount_view() { # ARGS
  "$bin" mount "$work/slow" "$work/view" --arc-max 1G --control "$ctl" "$@" 2>"$work/view.log" & pids+=($!)
  for _ in $(seq 200); do [ -S "$ctl" ] && mountpoint -q "$work/view" && return 0; sleep 0.05; done
  cat "$work/view.log" >&2; echo "bench: arcache mount did not come up" >&2; exit 1
}
unmount_view() {
  fusermount3 -u "$work/view"
  wait "${pids[-1]}" || true
}
# Until the L2 feed has written what it will: its size still for 3 s, its
# log committed (at most 2 minutes).
wait_feed() { wait_l2_feed 3 120; }
view() { # NAME [ARGS]: a server just started, then warm
  local name=$1
  shift
  mount_view "$@"
  timed "$name-first" copy "$work/view/small/d000" "$work/view/small/copy"
  timed "$name-warm" copy "$work/view/small/d000" "$work/view/small/copy"
  unmount_view
}
view_restart() { # the same with a persistent L2, then restarted on it
  rm -f "$work/l2.img"
  mount_view --l2 "$work/l2.img:1G"
  timed view-first copy "$work/view/small/d000" "$work/view/small/copy"
  timed view-warm copy "$work/view/small/d000" "$work/view/small/copy"
  wait_feed
  unmount_view
  mount_view --l2 "$work/l2.img:1G"
  for _ in $(seq 600); do [ "$(stat_field l2_rebuild_running)" = 0 ] && break; sleep 0.1; done
  timed view-restart copy "$work/view/small/d000" "$work/view/small/copy"
  unmount_view
}
check_floor() {
  python3 - "$work/slow/small/d000" "$work/names" <<'PY'
import os, sys
from concurrent.futures import ThreadPoolExecutor
paths = [os.path.join(sys.argv[1], n.strip()) for n in open(sys.argv[2])]
with ThreadPoolExecutor(32) as ex:
    list(ex.map(os.lstat, paths))
PY
}
fuse_floor() {
  bindfs "$ram" "$work/bind"
  timed bindfs copy "$work/bind/d000" "$work/bind/copy"
  fusermount3 -u "$work/bind"
}
for r in $(seq "$rounds"); do
  timed source copy "$work/slow/small/d000" "$work/slow/small/copy"
  timed floor copy "$ram/d000" "$work/slow/small/copy"
  fuse_floor
  timed check check_floor
  view_restart
  view nodefer --no-deferred-open
  view noahead --no-deferred-open --no-open-ahead
  echo "bench: round $r done" >&2
done
{
  echo "$header"
  echo
  nfiles=$(ls "$ram/d000" | wc -l)
  echo "bench/fileview.sh's slow source holding its small-file tree ($small files of 1-8 KB in 300 directories); \`rsync -a\` of the first directory ($nfiles files) to a new directory beside it; kernel caches dropped before every pass; seconds, one figure per round:"
  echo
  echo "| pass | seconds |"
  echo "|---|---|"
  echo "| on the source itself | ${t[source]}|"
  echo "| from a copy in RAM into the source (the source's writes alone) | ${t[floor]}|"
  echo "| through arcache mount, just started | ${t[view-first]}|"
  echo "| through arcache mount, again (ARC warm) | ${t[view-warm]}|"
  echo "| through arcache mount restarted on its L2 | ${t[view-restart]}|"
  echo "| through arcache mount --no-deferred-open, just started | ${t[nodefer-first]}|"
  echo "| through arcache mount --no-deferred-open, again (ARC warm) | ${t[nodefer-warm]}|"
  echo "| through arcache mount --no-deferred-open --no-open-ahead, just started | ${t[noahead-first]}|"
  echo "| through arcache mount --no-deferred-open --no-open-ahead, again (ARC warm) | ${t[noahead-warm]}|"
  echo "| inside bindfs over the copy in RAM (FUSE alone) | ${t[bindfs]}|"
  echo "| one lstat of each file on the source, 32 at once (the check floor) | ${t[check]}|"
  echo
  python3 - "${t[source]}" "${t[view-warm]}" "${t[view-restart]}" "${t[bindfs]}" "${t[check]}" <<'PY'
import statistics, sys
src, warm, restart, fuse, check = (statistics.median(map(float, a.split())) for a in sys.argv[1:])
print(f"Medians: the view warm {src / warm:.2f}x the source, restarted {src / restart:.2f}x. "
      f"Ceilings: no FUSE view can copy faster than FUSE alone, {src / fuse:.2f}x the source; "
      f"one that checks or opens every file on the source, as the view does after a restart, "
      f"at most {src / check:.2f}x.")
PY
} >"$work/result.md"
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
cat "$result"
