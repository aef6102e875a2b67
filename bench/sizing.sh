#!/usr/bin/env bash
# How faithful the live sizing's two estimates are (`arcache summary`, and
# `sizing` in `arcache stat --json`): the policy curve (one record in 64
# sampled by hash, the demand reads of the sample replayed through a
# miniature of the policy the server runs at 1/64 of each size, by the
# server's own code, arc_policy::live) and `hit_ratio_if_arc_doubled`
# (hits plus ghost hits over demand reads). At every reference point of the
# suite, crates/sim/examples/sizing.rs replays the trace in full as the
# server's cache would see it (reads counted; writes stored, patched or
# dropped as `arcache sim --writes-as-server` replays them, uncounted) and
# the estimates beside it, for arc-adaptive (the default
# policy) and OpenZFS's ARC (`arc`, the policy the live sizing served
# before it). arcache_sim::fidelity says what the model leaves out.
#
# Usage: bench/sizing.sh [TRACE_DIR]   (default: $ARCACHE_TRACES, else the
# repository's traces/, which has 5 of the 10 traces; a minute or two)
# Writes bench/results/sizing.md.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$(cd "${1:-${ARCACHE_TRACES:-$here/traces}}" && pwd)
[ -f "$dir/reference_hit_ratios.json" ] || { echo "bench: no reference_hit_ratios.json in $dir" >&2; exit 2; }
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
result=$(bench_results sizing.md)
header=$(bench_header "$dir")
bench_start arcache-sizing
(cd "$here" && cargo build --release -q -p arcache-sim --example sizing)
tool=${CARGO_TARGET_DIR:-$here/target}/release/examples/sizing
{
  echo "$header"
  echo
  echo "Each reference point (4 KiB blocks) replayed in full as the server's cache would see it (a read looked up and counted; a write, uncounted, stores a block it covers whole without a lookup, leaves one it covers in part where it is if cached and drops it if not: \`arcache sim --writes-as-server\`) and as the live sizing estimates it: the reads, stores and drops of one block in 64 (by the server's hash) replayed through the policy at 1/64 of the size, by arc_policy::live, the server's own code. Hit ratios of reads in %; error = estimate - full replay, in percentage points. Then the other live estimate, \`hit_ratio_if_arc_doubled\` (hits plus MRU and MFU ghost hits, over reads), against a full replay at twice the size (\"at 2x\"). The live curve replays only the last 65,536 sampled reads, stores and drops (about 4.2 M accesses), as the server does: of these traces only w106 (5.3 M) is longer. Not modelled (crates/sim/src/fidelity.rs): a cache that grows from zfs_arc_min, 16K records, prefetches, compression (a compressed record written in part the server stores again). The server gives no sizing advice below about 10,000 reads, so the errors are also given over the traces with more."
  echo
  "$tool" "$dir"
} > "$work/result.md"
bench_publish "$work/result.md" "$result"
cat "$result"
