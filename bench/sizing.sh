#!/usr/bin/env bash
# How faithful the live sizing's policy curve is (`arcache summary`, and
# `policy_curve` in `arcache stat --json`): the server samples one record
# in 64 by hash and replays the sample through a miniature of the policy
# it runs, at 1/64 of each size. At every reference point of the suite,
# crates/sim/examples/sizing.rs replays the trace in full and sampled that
# way, for arc-adaptive (the default policy) and OpenZFS's ARC (`arc`, the
# policy the live sizing served before it), and reports the sample's error.
#
# Usage: bench/sizing.sh [TRACE_DIR]   (default: $ARCACHE_TRACES, else the
# repository's traces/, which has 6 of the 10 traces; under a minute)
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
  echo "Each reference point (4k mode, reads and writes) replayed in full and as the live sizing replays it: one 4 KiB block in 64 sampled by hash, through a policy of 1/64 the size (crates/sim/examples/sizing.rs). Hit ratios in %; error = sampled - full, in percentage points. Then the other live estimate, \`hit_ratio_if_arc_doubled\` (hits plus MRU and MFU ghost hits, as the server computes it from arcstats), against a full replay at twice the size (\"at 2x\"). The server also keeps only the last 65,536 sampled reads for this curve (about 4.2 M block reads), which every trace of the suite fits in but w106 (5.3 M), replayed here whole."
  echo
  "$tool" "$dir" 64
} > "$work/result.md"
bench_publish "$work/result.md" "$result"
cat "$result"
