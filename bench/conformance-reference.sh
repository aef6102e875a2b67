#!/usr/bin/env bash
# Runs the NBD conformance script (crates/arcache/tests/conformance/) against
# nbdkit's file plugin, the reference server, on the same sparse images the
# test gives arcache, to show where the two answer differently.
#
# Usage: bench/conformance-reference.sh   (seconds)
# Writes bench/results/conformance-nbdkit.txt (commit and date first).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
for t in nbdkit; do command -v "$t" >/dev/null || { echo "bench: $t is missing" >&2; exit 2; }; done
/usr/bin/python3 -c 'import nbd' || { echo "bench: apt-get install python3-libnbd" >&2; exit 2; }
bench_start arcache-conformance
result=$(bench_results conformance-nbdkit.txt)
size=$((160 << 20))
layout=0:1048576,8388608:1048576,104857600:65536
for f in rw ro; do
  truncate -s "$size" "$work/$f.img"
  /usr/bin/python3 - "$work/$f.img" "$layout" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
for i, part in enumerate(sys.argv[2].split(",")):
    off, ln = map(int, part.split(":"))
    os.pwrite(fd, bytes([0x11 * (i + 1)]) * ln, off)
PY
done
nbdkit --foreground -U "$work/rw.sock" file "$work/rw.img" & pids+=($!)
nbdkit --foreground -r -U "$work/ro.sock" file "$work/ro.img" & pids+=($!)
wait_sock "$work/rw.sock"; wait_sock "$work/ro.sock"
{
  bench_header
  echo "# $(nbdkit --version), file plugin; the script's checks are what arcache answers (docs/nbd-protocol.md)"
  /usr/bin/python3 "$here/crates/arcache/tests/conformance/nbd_conformance.py" \
    "$work/rw.sock" "$work/ro.sock" "$size" "$layout" 2>&1 || true
} > "$work/result.txt"
# Only a whole result replaces a published one.
bench_publish "$work/result.txt" "$result"
grep -v '^ok' "$result"
