#!/usr/bin/env bash
# Where the serving policy (arc-adaptive) loses on the random families of
# bench/policy.sh: at a few of its worst points, each variant its copies
# try held from the start against the policy itself, and per window of
# 20,000 requests the policy's hit ratio and the variant it runs beside
# the best held variant's, and LRU's (crates/sim/examples/variants.rs). Two causes
# show: choosing late (the policy's windows match a variant's until its
# copies first choose) and a low state after a switch (the policy runs the
# best variant and hits far less than that variant held from the start).
# At each point a few schedules too: one variant held until some access,
# then another, against the second held from the start: what a switch
# costs.
#
# Usage: bench/policy-variants.sh   (about a minute; CPU only)
# Writes bench/results/policy-variants.md.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
result=$(bench_results policy-variants.md)
header=$(bench_header)
work=$(mktemp -d /tmp/arcache-policy-variants.XXXXXX)
trap 'rm -rf "$work"' EXIT
(cd "$here" && cargo build --release -q -p arcache-sim --example variants)
tool=${CARGO_TARGET_DIR:-$here/target}/release/examples/variants

# Each seed's schedules (A@N,B: variant A until N accesses, then B); the
# first is near the policy's own path where it switches.
declare -A schedules=(
  [21010]="1@45000,5 3@20000,5 3@45000,5 4@45000,5"
  [13016]="5@30000,0 1@45000,0 4@45000,0"
  [1031]="1@110000,4 1@60000,4"
  [9004]="1@90000,8 1@60000,8"
  [13000]="1@45000,9"
)
# seed, cache blocks, why it is here
points=(
  "21010 7272 the family of seeds 21000's worst point"
  "13016 7258 the family of seeds 13000's worst"
  "1031 16581 the first family's worst"
  "9004 25952 the family of seeds 9000's worst"
  "13000 10195 a drifting hot set: no variant but the recency one, 9, reaches LRU"
)
{
  echo "$header"
  echo
  echo "Each point: a trace of traces/tools/random_family.py (the seed alone decides it; 200,000 reads of 4 KiB, 1 ms apart) at one of its bench/policy.sh cache sizes, replayed by crates/sim/examples/variants.rs through arc-adaptive, through LRU, and through each variant its copies try (MRU's target as a fraction of the cache, and whether MFU takes in what leaves MRU unused: false, into its room only: true, or LRU: the recency variant, LRU in ARC's lists) held from the start; then schedules (one variant held until some access, then another, as a switch of the policy makes it) against the second variant held from the start; then arc-adaptive per window of 20,000 accesses beside the best held variant."
  for p in "${points[@]}"; do
    read -r seed size why <<<"$p"
    python3 "$here/traces/tools/random_family.py" "$work/s$seed" "$seed" 1 > "$work/s$seed.txt"
    # The size must be one bench/policy.sh replays this trace at.
    grep -Eq "^s$seed ([0-9]+,)*$size(,|\$)" "$work/s$seed/sizes.txt" ||
      { echo "bench: $size is not one of s$seed's sizes: $(cat "$work/s$seed/sizes.txt")" >&2; exit 1; }
    desc=$(sed 's/^s[0-9]*: //' "$work/s$seed.txt")
    echo
    echo "## s$seed at $size blocks ($why)"
    echo
    echo "$desc"
    echo
    # shellcheck disable=SC2086 # one word per schedule
    "$tool" "$work/s$seed/s$seed.csv.gz" "$size" 20000 ${schedules[$seed]}
  done
} > "$work/result.md"
# Only a whole result replaces the published one.
bench_publish "$work/result.md" "$result"
cat "$result"
