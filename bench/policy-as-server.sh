#!/usr/bin/env bash
# Hit ratios with writes replayed as `arcache serve` meets them
# (`arcache sim --writes-as-server`: a write is stored without a lookup and
# not counted; a block written in part is left where it is if cached,
# dropped if not), against the reference tools' way (every access looked
# up and counted, bench/policy.sh). Every trace of the suite with writes,
# at its reference sizes (4 KiB blocks), every policy `arcache sim` knows.
# A trace without writes replays the same both ways and is left out.
#
# Usage: bench/policy-as-server.sh [TRACE_DIR]   (default: $ARCACHE_TRACES,
# else the repository's traces/; a few minutes)
# Writes bench/results/policy-as-server.md.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$(cd "${1:-${ARCACHE_TRACES:-$here/traces}}" && pwd)
[ -f "$dir/reference_hit_ratios.json" ] || { echo "bench: no reference_hit_ratios.json in $dir" >&2; exit 2; }
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
result=$(bench_results policy-as-server.md)
header=$(bench_header "$dir")
bench_start arcache-policy-as-server
(cd "$here" && cargo build --release -q -p arcache)
bin=${CARGO_TARGET_DIR:-$here/target}/release/arcache
policies=default,arc,arc-paper,lru,s3fifo,2q,sieve
# The traces present with writes: NAME, FILE and SIZES, tab-separated.
python3 - "$dir" >"$work/traces.tsv" <<'PY'
import gzip, json, os, sys
d = sys.argv[1]
refs = json.load(open(os.path.join(d, "reference_hit_ratios.json")))["traces"]
def has_writes(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        # The ops `arcache sim` reads as writes (crates/sim/src/trace.rs).
        return any(line.split(",")[1:2] in (["W"], ["w"], ["1"]) for line in f)
for name, t in refs.items():
    path = os.path.join(d, t["csv"])
    sizes = t.get("modes", {}).get("4k", {}).get("sizes_blocks")
    if sizes and os.path.exists(path) and has_writes(path):
        print(name, path, ",".join(str(n) for n in sizes), sep="\t")
PY
[ -s "$work/traces.tsv" ] || { echo "bench: no trace with writes in $dir" >&2; exit 1; }
while IFS=$'\t' read -r name path sizes; do
  echo "bench: $name" >&2
  for mode in counted server; do
    extra=
    [ "$mode" = server ] && extra=--writes-as-server
    "$bin" sim --json ${extra:+"$extra"} --trace "$path" --policy "$policies" --cache-blocks "$sizes" \
      >"$work/run.jsonl" 2>>"$work/sim.log" </dev/null
    # Each line tagged with its trace and mode.
    python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line); r["trace"] = sys.argv[2]; r["mode"] = sys.argv[3]; print(json.dumps(r))' \
      "$work/run.jsonl" "$name" "$mode" >>"$work/runs.jsonl" </dev/null
  done
done <"$work/traces.tsv"
{
  echo "$header"
  echo
  python3 - "$work/runs.jsonl" "$policies" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
names = sys.argv[2].split(",")
def short(p):
    return "default" if p.startswith("default:") else p
by = {}
for r in runs:
    by[(r["trace"], r["cache_blocks"], r["mode"], short(r["policy"]))] = r
points = sorted({(r["trace"], r["cache_blocks"]) for r in runs}, key=lambda p: (p[0], p[1]))
pct = lambda r: 100.0 * r["hit_ratio"]
print("Hit ratios of reads in %, writes replayed as the server meets them (`arcache sim --writes-as-server`). "
      "`default` is what `arcache serve` runs (arc-adaptive in bytes). The last two columns: `default` with every "
      "access looked up and counted (bench/policy.sh's way, over reads and writes), and the share of accesses that write.")
print()
print("| trace | cache blocks | reads | " + " | ".join(names) + " | default, every access counted | writes |")
print("|---|---:|---:|" + "---:|" * len(names) + "---:|---:|")
for t, s in points:
    srv = {n: by[(t, s, "server", n)] for n in names}
    cnt = by[(t, s, "counted", "default")]
    reads = srv["default"]["requests"]
    writes = 1 - reads / cnt["requests"]
    cells = " | ".join(f"{pct(srv[n]):.2f}" for n in names)
    print(f"| {t} | {s:,} | {reads:,} | {cells} | {pct(cnt):.2f} | {100 * writes:.1f} % |")
print()
def summary(sel, label):
    print(f"Over {label} ({len(sel)} points), writes replayed as the server meets them:")
    print()
    print("| policy | mean hit ratio | points more than 1 pp below max(LRU, arc-paper) | worst against that max (pp) |")
    print("|---|---:|---:|---:|")
    for n in names:
        vals, below, worst = [], 0, None
        for t, s in sel:
            v = pct(by[(t, s, "server", n)])
            m = max(pct(by[(t, s, "server", "lru")]), pct(by[(t, s, "server", "arc-paper")]))
            vals.append(v)
            below += v < m - 1.0
            d = v - m
            if worst is None or d < worst[0]:
                worst = (d, t, s)
        print(f"| {n} | {sum(vals) / len(vals):.2f} | {below} | {worst[0]:+.2f} ({worst[1]}, {worst[2]:,}) |")
    print()
summary(points, "every point")
big = [p for p in points if by[(p[0], p[1], "server", "default")]["requests"] >= 10000]
if big and len(big) != len(points):
    summary(big, "the points of traces with 10,000 reads or more")
PY
} >"$work/result.md"
bench_publish "$work/result.md" "$result"
cat "$result"
