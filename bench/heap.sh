#!/usr/bin/env bash
# The server's heap beyond the cached data, per cached record, for builds
# of several commits: what `ab-read.sh`'s RSS column measures, without
# the allocator's noise. Each commit is built in a git worktree with the
# system allocator instead of mimalloc (the `#[global_allocator]` lines of
# crates/arcache/src/main.rs removed), serves a 256 MiB file of random
# bytes with --arc-max 1G, is read whole twice with nbdcopy (every record
# cached, nothing evicted: checked), and glibc's `malloc_stats()` (called
# through gdb) gives the bytes in use. mimalloc's RSS moves by hundreds of
# bytes a record between runs of one build (bench/README); the bytes in
# use move by a few.
#
# Usage: bench/heap.sh RUNS COMMIT...   (e.g. bench/heap.sh 3 4a45d3c HEAD;
# each build a few minutes, each run seconds; needs gdb, nbdcopy, git).
# Builds go to $HEAP_TARGET_DIR (default $BENCH_DIR/arcache-heap-target),
# kept for the next run.
# Writes bench/results/heap${HEAP_NAME:+-$HEAP_NAME}.md.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
[ $# -ge 2 ] || { echo "usage: bench/heap.sh RUNS COMMIT..." >&2; exit 2; }
runs=$1; shift
for tool in gdb nbdcopy git python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is missing" >&2; exit 2; }
done
result=$(bench_results "heap${HEAP_NAME:+-$HEAP_NAME}.md")
header=$(bench_header "$runs" "$@")
bench_start arcache-heap
# A build that fails leaves its worktree registered: removed at exit.
wt="$work/wt"
heap_cleanup() {
  git -C "$here" worktree remove --force "$wt" 2>/dev/null || true
  bench_cleanup
}
trap heap_cleanup EXIT
target=${HEAP_TARGET_DIR:-${BENCH_DIR:-/var/tmp}/arcache-heap-target}
recordsize=16384
data=$((256 << 20))
head -c "$data" /dev/urandom > "$work/disk.img"

# build COMMIT: prints the path of arcache built from COMMIT with the system allocator.
build() {
  local sha
  sha=$(git -C "$here" rev-parse --short "$1")
  git -C "$here" worktree add -q --detach "$wt" "$sha" >&2
  sed -i '/^#\[global_allocator\]/,+1d' "$wt/crates/arcache/src/main.rs"
  ! grep -q global_allocator "$wt/crates/arcache/src/main.rs" || { echo "bench: $sha keeps its allocator" >&2; exit 1; }
  (cd "$wt" && CARGO_TARGET_DIR=$target cargo build --release -q -p arcache) >&2
  cp "$target/release/arcache" "$work/arcache-$sha"
  git -C "$here" worktree remove --force "$wt" >&2
  echo "$work/arcache-$sha"
}

# measure BIN: "HEAP_IN_USE RSS" (bytes) after the warm reads.
measure() {
  local bin=$1 log="$work/serve.log" srv rss_kb inuse
  rm -f "$work/nbd.sock" "$work/ctl.sock"
  : > "$log"
  "$bin" serve --export "$work/disk.img" --arc-max 1G --listen "unix:$work/nbd.sock" \
    --control "$work/ctl.sock" >>"$log" 2>&1 & srv=$!
  pids+=("$srv")
  wait_sock "$work/nbd.sock"; wait_sock "$work/ctl.sock"
  nbdcopy "nbd+unix:///?socket=$work/nbd.sock" null:
  nbdcopy "nbd+unix:///?socket=$work/nbd.sock" null:
  rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$srv/status")
  # malloc_stats() writes to the server's stderr, which is $log.
  timeout 60 gdb -p "$srv" -batch -ex 'call (void)malloc_stats()' >"$work/gdb.log" 2>&1 ||
    { echo "bench: gdb could not call malloc_stats in $bin" >&2; cat "$work/gdb.log" >&2; exit 1; }
  for _ in $(seq 50); do grep -q "^Total" "$log" && break; sleep 0.1; done
  inuse=$(grep -A2 "^Total" "$log" | awk '/in use bytes/ {print $NF}') || true
  [ -n "$inuse" ] || { echo "bench: no malloc_stats from $bin" >&2; cat "$log" "$work/gdb.log" >&2; exit 1; }
  # Every record cached, none evicted: the job measures holding, not churn.
  "$bin" stat --control "$work/ctl.sock" --json | python3 -c '
import json, sys
d, records, data = json.load(sys.stdin), int(sys.argv[1]), int(sys.argv[2])
ghosts = d["mru_ghost_size"] + d["mfu_ghost_size"]
assert d["deleted"] == 0 and ghosts == 0, "the server evicted"
assert d["hash_elements"] == records and d["data_size"] >= data, f"not every record cached: {d}"' \
    "$((data / recordsize))" "$data"
  kill -INT "$srv"; wait "$srv" || true
  echo "$inuse $((rss_kb * 1024))"
}

{
  echo "$header"
  echo
  echo "A 256 MiB file of random bytes served with --arc-max 1G and recordsize 16K (16,384 records), read whole twice with nbdcopy, nothing evicted; then glibc's bytes in use (malloc_stats) and VmRSS, each less the data, over the records. Builds with the system allocator, not mimalloc (what the release binary uses), so the bytes in use count what the code holds. $runs runs each, alternating builds."
  echo
  echo "| commit | heap in use beyond data per record (bytes, each run) | median | VmRSS beyond data per record (bytes, each run) | median |"
  echo "|---|---|---:|---|---:|"
} > "$work/result.md"
bins=()
for c in "$@"; do
  # The same commit named twice would share a row.
  for b in "${bins[@]}"; do
    [ "${b##*/arcache-}" != "$(git -C "$here" rev-parse --short "$c")" ] || { echo "bench: $c named twice" >&2; exit 2; }
  done
  build "$c" > "$work/built"
  bins+=("$(cat "$work/built")")
done
declare -A heap rss
for ((r = 0; r < runs; r++)); do
  for b in "${bins[@]}"; do
    measure "$b" > "$work/measured"
    read -r inuse rss_b < "$work/measured"
    heap[$b]+="$(( (inuse - data) / (data / recordsize) )) "
    rss[$b]+="$(( (rss_b - data) / (data / recordsize) )) "
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for b in "${bins[@]}"; do
  hm=$(echo "${heap[$b]}" | median)
  rm_=$(echo "${rss[$b]}" | median)
  echo "| ${b##*/arcache-} | ${heap[$b]% } | $hm | ${rss[$b]% } | $rm_ |" >> "$work/result.md"
done
bench_publish "$work/result.md" "$result"
cat "$result"
