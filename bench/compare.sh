#!/usr/bin/env bash
# Compares, in one run, fio's nbd engine against:
#   - nbdkit's memory plugin (a C server answering from RAM), the peer to beat;
#   - arcache with the whole image resident in its ARC;
#   - nbdkit's file plugin with the delay filter: the slow origin alone;
#   - arcache in front of that slow origin, cold and warm.
# Reports IOPS and MB/s for 4K random reads at QD1 and QD16 and 128K
# sequential reads, and the ratios that matter. Absolute numbers on a small
# shared machine are noise; ratios from the same run are the result.
#
# Usage: bench/compare.sh [SIZE_MIB] [SECONDS_PER_JOB]   (about 2 minutes at 256 8)
# Writes bench/results/compare.md (commit and date on its first line); fio's
# JSON and the servers' logs go to bench/out/.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
size_mib=${1:-256}
secs=${2:-8}
for t in fio nbdkit nbdcopy python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (apt-get install fio nbdkit libnbd-bin)" >&2; exit 2; }
done
cargo build --release --quiet --manifest-path "$here/Cargo.toml"
bin="$here/target/release/arcache"
work=$(mktemp -d /tmp/arcache-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
out="$here/bench/out"; mkdir -p "$out"
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
result=$(bench_results compare.md)
header=$(bench_header "$size_mib" "$secs")

img="$work/disk.img"
head -c $((size_mib << 20)) /dev/urandom > "$img"

# Peer: nbdkit memory, filled with the same bytes.
nbdkit --foreground -U "$work/mem.sock" memory "${size_mib}M" & pids+=($!)
wait_sock "$work/mem.sock"
nbdcopy "$img" "nbd+unix:///?socket=$work/mem.sock"

# arcache over the plain file, warmed so everything is in the ARC.
"$bin" serve --export "$img" --listen "unix:$work/arc.sock" --control "$work/arc.ctl" \
  --arc-max $((size_mib * 2))M >"$out/arcache.log" 2>&1 & pids+=($!)
wait_sock "$work/arc.sock"
nbdcopy "nbd+unix:///?socket=$work/arc.sock" null:

# Slow origin: nbdkit file plugin with 4 ms per read, and arcache in front of it.
nbdkit --foreground -U "$work/slow.sock" --filter=delay file "$img" rdelay=4ms & pids+=($!)
wait_sock "$work/slow.sock"
"$bin" serve --export "nbd+unix:///?socket=$work/slow.sock" --listen "unix:$work/front.sock" \
  --control "$work/front.ctl" --arc-max $((size_mib * 2))M >"$out/front.log" 2>&1 & pids+=($!)
wait_sock "$work/front.sock"

run_fio() { # name uri rw bs iodepth [extra...]
  local name=$1 uri=$2 rw=$3 bs=$4 qd=$5; shift 5
  fio --name="$name" --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" --iodepth="$qd" \
      --size="${size_mib}M" --time_based --runtime="$secs" --randseed=42 "$@" \
      --output-format=json --output="$out/$name.json" >/dev/null
}

declare -A uri=(
  [nbdkit-memory]="nbd+unix:///?socket=$work/mem.sock"
  [arcache-warm]="nbd+unix:///?socket=$work/arc.sock"
)
for peer in nbdkit-memory arcache-warm; do
  run_fio "$peer-4k-qd1" "${uri[$peer]}" randread 4k 1
  run_fio "$peer-4k-qd16" "${uri[$peer]}" randread 4k 16
  run_fio "$peer-128k-seq" "${uri[$peer]}" read 128k 4
done
# The slow origin alone, then arcache in front of it: first touch (cold) and
# a second pass over the same small working set (warm).
ws=$((size_mib / 8))M
run_fio "slow-origin-4k-qd16" "nbd+unix:///?socket=$work/slow.sock" randread 4k 16 --size="$ws"
run_fio "front-cold-4k-qd16" "nbd+unix:///?socket=$work/front.sock" randread 4k 16 --size="$ws"
nbdcopy "nbd+unix:///?socket=$work/front.sock" null: >/dev/null 2>&1 || true
run_fio "front-warm-4k-qd16" "nbd+unix:///?socket=$work/front.sock" randread 4k 16 --size="$ws"
"$bin" stat --json --control "$work/front.ctl" > "$out/front-stat.json"

python3 - "$out" "$work/result.md" "$header" "$size_mib" "$secs" <<'PY'
import json, sys, os
out, result, header, size_mib, secs = sys.argv[1:]
def r(name):
    with open(os.path.join(out, name + ".json")) as f:
        j = json.load(f)["jobs"][0]["read"]
    return j["iops"], j["bw_bytes"] / 1e6
rows = [
    ("4K random read, QD1", "4k-qd1"),
    ("4K random read, QD16", "4k-qd16"),
    ("128K sequential read, QD4", "128k-seq"),
]
lines = [header, "",
         f"{size_mib} MiB image of random bytes; fio --ioengine=nbd, {secs} s per job, --randseed=42.", "",
         "| workload | nbdkit memory | arcache (ARC-resident) | arcache / nbdkit |", "|---|---|---|---|"]
ratios = {}
for label, key in rows:
    ni, nb = r("nbdkit-memory-" + key)
    ai, ab = r("arcache-warm-" + key)
    ratios[key] = ai / ni
    lines.append(f"| {label} | {ni:,.0f} IOPS, {nb:,.0f} MB/s | {ai:,.0f} IOPS, {ab:,.0f} MB/s | {ai/ni:.2f}x |")
so, _ = r("slow-origin-4k-qd16"); fc, _ = r("front-cold-4k-qd16"); fw, _ = r("front-warm-4k-qd16")
lines.append("")
lines.append("| slow origin (nbdkit file + 4 ms delay), 4K random QD16 | IOPS | vs origin |")
lines.append("|---|---|---|")
lines.append(f"| origin alone | {so:,.0f} | 1.00x |")
lines.append(f"| arcache in front, first run (starts cold) | {fc:,.0f} | {fc/so:.2f}x |")
lines.append(f"| arcache in front, working set resident | {fw:,.0f} | {fw/so:.1f}x |")
text = "\n".join(lines)
print(text)
with open(result, "w") as f:
    f.write(text + "\n")
print(f"\nratio_4k_qd16={ratios['4k-qd16']:.3f} (target >= 0.9)")
PY
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
