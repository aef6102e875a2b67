#!/usr/bin/env bash
# Checks bench_publish (bench/lib.sh), the one way a benchmark writes its
# result file: whole or not at all. No benchmark runs; a second or so.
#
# Usage: bench/lib-test.sh   (prints one line a check; fails on the first wrong one)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
t=$(mktemp -d "${TMPDIR:-/tmp}/bench-lib-test.XXXXXX")
trap 'rm -rf "$t"' EXIT
# The finished results are built on another file system when there is one
# (a benchmark's work directory under /var/tmp need not be on the
# repository's), where a plain `mv` would not be a rename.
src=$t
if [ -d /dev/shm ] && [ -w /dev/shm ] && shm=$(mktemp -d /dev/shm/bench-lib-test.XXXXXX); then
  src=$shm
  trap 'rm -rf "$t" "$src"' EXIT
fi
dest=$t/results
mkdir "$dest"
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
no_partials() { [ -z "$(find "$dest" -name '.*.partial.*')" ] || fail "a temporary copy is left in $dest"; }

# 1. A published result is FILE's bytes, renamed over DEST: a reader that
# had the old DEST open reads the old result whole, not a mix.
printf 'old result\n' >"$dest/a.md"
seq 100000 >"$src/a.md"
exec 3<"$dest/a.md"
bench_publish "$src/a.md" "$dest/a.md"
seq 100000 | cmp -s - "$dest/a.md" || fail "DEST does not hold FILE's bytes"
[ "$(cat <&3)" = "old result" ] || fail "the old DEST was written in place"
exec 3<&-
[ "$(stat -c %a "$dest/a.md")" = "$(printf '%o' $((0666 & ~$(umask))))" ] || fail "DEST's mode is not the umask's"
no_partials
ok "publish replaces DEST by a rename, with FILE's bytes and the umask's mode"

# 2. A benchmark that fails after writing part of its result, before it
# publishes, leaves DEST as it was (or absent), and its work directory goes.
printf 'old result\n' >"$dest/b.md"
status=0
BENCH_DIR=$t bash -c '
  set -euo pipefail
  . "$1/lib.sh"
  bench_start arcache-lib-test
  echo "$work" >"$2/work"
  echo "# header" >"$work/result.md"
  echo "first piece" >>"$work/result.md"
  false   # a failed step of the run
  echo "second piece" >>"$work/result.md"
  bench_publish "$work/result.md" "$2/results/b.md"
  bench_publish "$work/result.md" "$2/results/new.md"
' _ "$here" "$t" || status=$?
[ "$status" = 1 ] || fail "the failing run exited $status"
[ "$(cat "$dest/b.md")" = "old result" ] || fail "a failed run changed DEST"
[ ! -e "$dest/new.md" ] || fail "a failed run created DEST"
[ ! -e "$(cat "$t/work")" ] || fail "the work directory was left"
no_partials
ok "a run failing before it publishes leaves DEST as it was, or absent"

# 3. A copy that fails (here the second FILE is missing) changes no DEST,
# the first included, and stops a caller under set -e.
printf 'old c\n' >"$dest/c.md"; printf 'old d\n' >"$dest/d.png"
printf 'new c\n' >"$src/c.md"
status=0
bash -c 'set -e; . "$1/lib.sh"; bench_publish "$2/c.md" "$3/c.md" "$2/missing.png" "$3/d.png"; echo reached' \
  _ "$here" "$src" "$dest" >"$t/out" 2>/dev/null || status=$?
[ "$status" != 0 ] && [ ! -s "$t/out" ] || fail "a failed publish did not stop its caller"
[ "$(cat "$dest/c.md")" = "old c" ] && [ "$(cat "$dest/d.png")" = "old d" ] || fail "a failed copy changed a DEST"
no_partials
ok "a failed copy changes no DEST and stops the caller"

# 4. A run killed mid-copy leaves DEST whole: the copy is fed from a FIFO
# that stops half way, the publishing shell killed there.
printf 'old e\n' >"$dest/e.md"
mkfifo "$src/e.md"
bash -c '. "$1/lib.sh"; bench_publish "$2/e.md" "$3/e.md"' _ "$here" "$src" "$dest" &
publisher=$!
exec 4<>"$src/e.md"   # read-write: opening it does not wait for the copy
echo "half a result" >&4
for _ in $(seq 100); do [ -n "$(find "$dest" -name '.e.md.partial.*' -size +0)" ] && break; sleep 0.02; done
[ -n "$(find "$dest" -name '.e.md.partial.*' -size +0)" ] || fail "the copy did not start"
kill -9 "$publisher"; wait "$publisher" 2>/dev/null || true
exec 4>&-   # the orphaned cp sees the end of its input and exits
[ "$(cat "$dest/e.md")" = "old e" ] || fail "a run killed mid-copy changed DEST"
ok "a run killed mid-copy leaves DEST as it was (and a .partial beside it)"

# 5. Misuse: an odd number of arguments is refused.
status=0; bench_publish "$src/a.md" 2>/dev/null || status=$?
[ "$status" = 2 ] || fail "one argument gave status $status"
ok "an odd number of arguments is refused"
