#!/usr/bin/env bash
# The L2ARC figures, in one run (issue 3):
#   origin  = nbdkit file ORIGIN with the rate (300 MB/s) and delay (4 ms) filters,
#             like the raidz of seed 000;
#   arcache = arcache serve --arc-max 256M --l2 L2FILE:4G in front of the origin,
#             default tunables;
#   nbdkit-cache = nbdkit's cache filter in front of the same origin, its cache
#             file on the same disk;
#   raw L2  = fio with O_DIRECT on a file on the same disk as the L2 file.
# Both servers run in their own 512 MiB memory cgroup (v1), when one can be
# made, so the host page cache is no hidden third tier.
#
# Seed 000: a 2 GiB region read sequentially twice with 1 MiB requests.
# Seed 003: 4K random reads at queue depth 16 over a 1 GiB region, warm;
#           and a thread-scaling sweep (queue depth 1..64) written as a PNG.
#
# Usage: bench/l2arc.sh [SECONDS_PER_RANDOM_JOB]   (default 20; about 25 minutes)
# Needs fio, nbdkit, libnbd-bin, python3 with matplotlib. Writes bench/results/l2arc-summary.md
# (commit and date on its first line) and bench/results/l2arc-thread-scaling.png;
# fio's JSON and the server's log go to bench/out/l2arc-*.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-20}
for t in fio nbdkit nbdcopy python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (apt-get install fio nbdkit libnbd-bin)" >&2; exit 2; }
done
# Checked before the run, not found missing at its end when the plot is drawn.
python3 -c 'import matplotlib' 2>/dev/null || { echo "bench: the Python package matplotlib is missing (pip install matplotlib, or apt-get install python3-matplotlib)" >&2; exit 2; }
cargo build --release --quiet --manifest-path "$here/Cargo.toml"
bin="$here/target/release/arcache"
out="$here/bench/out"; mkdir -p "$out"
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
result=$(bench_results l2arc-summary.md)
plot=$(bench_results l2arc-thread-scaling.png)
header=$(bench_header "$secs")
bench_start arcache-l2bench
cgroups=()
cleanup_all() {
  bench_cleanup
  for c in "${cgroups[@]}"; do rmdir "$c" 2>/dev/null || true; done
}
trap cleanup_all EXIT

cgroot=/sys/fs/cgroup/memory
# Called as $(make_cgroup ...), a subshell: the caller records the path in
# `cgroups` for the cleanup.
make_cgroup() { # name -> path or empty
  local cg="$cgroot/arcache-bench-$1-$$"
  if [ -w "$cgroot" ] && mkdir "$cg" 2>/dev/null && echo 512M > "$cg/memory.limit_in_bytes"; then
    # Throttle rather than kill: nbdkit's cache filter fills the page cache
    # with dirty pages of its cache file faster than writeback frees them.
    echo 1 > "$cg/memory.oom_control" 2>/dev/null || true
    echo "$cg"
  fi
}
in_cgroup() { # cgroup-path command...  (runs in the background, pid appended)
  local cg=$1; shift
  if [ -n "$cg" ]; then
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@" & pids+=($!)
  else
    "$@" & pids+=($!)
  fi
}

echo "== preparing a 2 GiB origin image and the raw-disk reference"
rm -f "$out"/l2arc-*.json "$out/l2arc-failed.txt"
head -c 2G /dev/urandom > "$work/origin.img"
fio --name=prep --filename="$work/raw.img" --rw=write --bs=1M --size=2G --direct=1 \
    --output-format=json --output="$out/l2arc-raw-prep.json" >/dev/null
fio --name=rawseq --filename="$work/raw.img" --rw=read --bs=1M --size=2G --direct=1 \
    --output-format=json --output="$out/l2arc-raw-seq.json" >/dev/null
fio --name=rawrand --filename="$work/raw.img" --rw=randread --bs=16k --size=1G --direct=1 --iodepth=16 \
    --ioengine=libaio --time_based --runtime=10 --output-format=json --output="$out/l2arc-raw-rand.json" >/dev/null

nbdkit --foreground -U "$work/origin.sock" --filter=rate --filter=delay file "$work/origin.img" \
  rdelay=4ms rate=2400M & pids+=($!)
wait_sock "$work/origin.sock"
origin="nbd+unix:///?socket=$work/origin.sock"

cg_arc=$(make_cgroup arcache || true)
[ -z "$cg_arc" ] || cgroups+=("$cg_arc")
start_arcache() {
  in_cgroup "$cg_arc" "$bin" serve --export "$origin" --listen "unix:$work/arc.sock" \
    --control "$work/arc.ctl" --arc-max 256M --l2 "$work/l2.img:4G" >>"$out/l2arc-arcache.log" 2>&1
  arc_pid=${pids[-1]}
  wait_sock "$work/arc.sock"
}
: > "$out/l2arc-arcache.log"
start_arcache
arc="nbd+unix:///?socket=$work/arc.sock"

cg_kit=$(make_cgroup nbdkit || true)
[ -z "$cg_kit" ] || cgroups+=("$cg_kit")
mkdir -p "$work/kitcache"
start_kit() {
  in_cgroup "$cg_kit" env TMPDIR="$work/kitcache" nbdkit --foreground -U "$work/kit.sock" --filter=cache \
    nbd socket="$work/origin.sock" cache-on-read=true cache-max-size=4G
  kit_pid=${pids[-1]}
  wait_sock "$work/kit.sock"
}
start_kit
kit="nbd+unix:///?socket=$work/kit.sock"
echo "cgroups: arcache=${cg_arc:-none} nbdkit-cache=${cg_kit:-none}"

# A job that fails or hangs is recorded as failed, not fatal to the run.
seq_pass() { # name uri
  timeout 300 fio --name="$1" --ioengine=nbd --uri="$2" --rw=read --bs=1M --size=2G --iodepth=1 \
      --output-format=json --output="$out/l2arc-$1.json" >/dev/null 2>&1 || echo "$1 failed" >> "$out/l2arc-failed.txt"
}
rand_job() { # name uri qd seconds
  timeout $(( $4 + 120 )) fio --name="$1" --ioengine=nbd --uri="$2" --rw=randread --bs=4k --size=1G --iodepth="$3" \
      --time_based --runtime="$4" --randseed=7 --output-format=json --output="$out/l2arc-$1.json" >/dev/null 2>&1 \
      || echo "$1 failed" >> "$out/l2arc-failed.txt"
}
feed_settled() { # waits until the feed has stopped writing and committed (at most 60 s)
  local last=-1 now
  for _ in $(seq 60); do
    now=$("$bin" stat --json --control "$work/arc.ctl" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["l2_write_bytes"], d["l2_log_uncommitted_bytes"])')
    [ "$now" = "$last" ] && [ "${now#* }" = 0 ] && return 0
    last=$now; sleep 1
  done
}

echo "== seed 000: 2 GiB sequential, twice"
seq_pass origin-seq-1 "$origin"
seq_pass arcache-seq-1 "$arc"
feed_settled
"$bin" stat --json --control "$work/arc.ctl" > "$out/l2arc-arcache-before-seq-2.json"
seq_pass arcache-seq-2 "$arc"
"$bin" stat --json --control "$work/arc.ctl" > "$out/l2arc-arcache-after-seq-2.json"
seq_pass kit-seq-1 "$kit"
seq_pass kit-seq-2 "$kit"

echo "== seed 003: 4K random reads over 1 GiB, queue depth 16"
rand_job origin-rand "$origin" 16 10
# Each cache gets the same warm-up: one run of the measured job.
rand_job arcache-rand-warmup "$arc" 16 "$secs"
rand_job arcache-rand "$arc" 16 "$secs"
# Same-run A/B of partial L2 reads (a 4K read of a cold record reads only its half from L2).
"$bin" set l2arc_partial_reads=0 --control "$work/arc.ctl" >/dev/null
rand_job arcache-rand-nopartial "$arc" 16 "$secs"
"$bin" set l2arc_partial_reads=1 --control "$work/arc.ctl" >/dev/null
rand_job arcache-rand-partial "$arc" 16 "$secs"
# Same-run A/B of L2 reads through the io_uring ring vs worker threads.
"$bin" set l2arc_ring_reads=0 --control "$work/arc.ctl" >/dev/null
rand_job arcache-rand-noring "$arc" 16 "$secs"
"$bin" set l2arc_ring_reads=1 --control "$work/arc.ctl" >/dev/null
rand_job arcache-rand-ring "$arc" 16 "$secs"
rand_job kit-rand-warmup "$kit" 16 "$secs"
rand_job kit-rand "$kit" 16 "$secs"
"$bin" stat --json --control "$work/arc.ctl" > "$out/l2arc-arcache-stat.json"

echo "== thread scaling"
for qd in 1 2 4 8 16 32 64; do
  rand_job "scale-arcache-qd$qd" "$arc" "$qd" 5
  rand_job "scale-origin-qd$qd" "$origin" "$qd" 5
done
for cg in "$cg_arc" "$cg_kit"; do
  [ -n "$cg" ] || continue
  peak=$(cat "$cg/memory.max_usage_in_bytes")
  echo "$cg peak memory: $peak"
done > "$out/l2arc-memory.txt"

echo "== warm restart: 4K random reads at QD16 in the first 10 s after a restart"
# arcache stops cleanly and rebuilds its L2 index from the log; nbdkit's
# cache filter keeps its cache in an unlinked temporary file, so it starts cold.
kill -TERM "$arc_pid"; wait "$arc_pid" 2>/dev/null || true
rm -f "$work/arc.sock"
restart_t0=$(date +%s.%N)
start_arcache
restart_t1=$(date +%s.%N)
restart_s=$(python3 -c "print(f'{$restart_t1 - $restart_t0:.2f}')")
echo "arcache answering $restart_s s after start" > "$out/l2arc-restart.txt"
rand_job arcache-restart "$arc" 16 10
"$bin" stat --json --control "$work/arc.ctl" > "$out/l2arc-arcache-restart-stat.json"
kill -TERM "$kit_pid"; wait "$kit_pid" 2>/dev/null || true
rm -f "$work/kit.sock"
start_kit
rand_job kit-restart "$kit" 16 10

echo "== header RAM per L2 record at 5 million records"
(cd "$here" && cargo test --release --quiet -p arcache-l2 --test ring_model hdr_bytes -- --nocapture 2>/dev/null \
  | grep "bytes" > "$out/l2arc-hdr.txt") || true

# The summary and the plot are made in the work directory and published
# together once both are whole: a run that fails leaves bench/results/ as
# it was, not a new summary beside an old plot.
python3 - "$out" "$work/l2arc-summary.md" "$work/l2arc-thread-scaling.png" "$header" <<'PY'
import json, os, sys
out, result, plot, header = sys.argv[1:]
def job(name):
    try:
        with open(os.path.join(out, f"l2arc-{name}.json")) as f:
            return json.load(f)["jobs"][0]["read"]
    except (OSError, ValueError, KeyError, IndexError):
        return {"bw_bytes": float("nan"), "iops": float("nan"), "clat_ns": {"mean": float("nan")}}
def mbs(name): return job(name)["bw_bytes"] / 1e6
def iops(name): return job(name)["iops"]
def lat_ms(name): return job(name)["clat_ns"]["mean"] / 1e6
raw_seq, raw_rand = mbs("raw-seq"), iops("raw-rand")
o1, a1, a2, k1, k2 = (mbs(n) for n in ["origin-seq-1", "arcache-seq-1", "arcache-seq-2", "kit-seq-1", "kit-seq-2"])
oi, ai, ki = iops("origin-rand"), iops("arcache-rand"), iops("kit-rand")
st = json.load(open(os.path.join(out, "l2arc-arcache-stat.json")))
try:
    rs = json.load(open(os.path.join(out, "l2arc-arcache-restart-stat.json")))
except (OSError, ValueError):
    rs = {}
def stat_file(name):
    try:
        return json.load(open(os.path.join(out, f"l2arc-{name}.json")))
    except (OSError, ValueError):
        return {}
before2, after2 = stat_file("arcache-before-seq-2"), stat_file("arcache-after-seq-2")
def delta(k): return after2.get(k, 0) - before2.get(k, 0)
hdr = open(os.path.join(out, "l2arc-hdr.txt")).read().strip() if os.path.exists(os.path.join(out, "l2arc-hdr.txt")) else "n/a"
mem = open(os.path.join(out, "l2arc-memory.txt")).read().strip()
lines = [
    header,
    "",
    "## Seed 000: 2 GiB sequential read, 1 MiB requests, QD1",
    "| server | pass 1 MB/s | pass 2 MB/s | pass 2 / pass 1 |", "|---|---|---|---|",
    f"| origin alone | {o1:,.0f} | | |",
    f"| arcache (ARC 256M + L2 4G) | {a1:,.0f} | {a2:,.0f} | {a2/a1:.2f}x |",
    f"| nbdkit cache filter | {k1:,.0f} | {k2:,.0f} | {k2/k1:.2f}x |",
    f"| raw L2 disk, O_DIRECT 1M | {raw_seq:,.0f} | | |",
    f"arcache pass 2 / raw L2 sequential = {a2/raw_seq:.2f}x (target >= 0.7); pass 2 / pass 1 = {a2/a1:.2f}x (target >= 3)",
    f"arcache pass 2 read {delta('l2_read_bytes')/1e6:,.0f} MB from L2 and {delta('backing_read_bytes')/1e6:,.0f} MB from the origin; "
    f"L2 held {before2.get('l2_size', 0)/1e6:,.0f} MB when it started",
    "",
    "## Seed 003: 4K random read over 1 GiB, QD16, warm",
    "| server | IOPS | mean latency ms | vs origin |", "|---|---|---|---|",
    f"| origin alone | {oi:,.0f} | {lat_ms('origin-rand'):.2f} | 1.00x |",
    f"| arcache | {ai:,.0f} | {lat_ms('arcache-rand'):.3f} | {ai/oi:.1f}x |",
    f"| nbdkit cache filter | {ki:,.0f} | {lat_ms('kit-rand'):.3f} | {ki/oi:.1f}x |",
    f"| raw L2 disk, 16K O_DIRECT QD16 | {raw_rand:,.0f} | | |",
    f"arcache / origin = {ai/oi:.1f}x (target >= 6.7); arcache / nbdkit cache = {ai/ki:.1f}x (target >= 5)",
    f"partial L2 reads A/B (same run, in this order): warm-up {iops('arcache-rand-warmup'):,.0f} / on {ai:,.0f} / off {iops('arcache-rand-nopartial'):,.0f} / on {iops('arcache-rand-partial'):,.0f} IOPS; "
    f"l2_partial_reads={st.get('l2_partial_reads')}",
    f"io_uring ring A/B (same run, after the above): ring off {iops('arcache-rand-noring'):,.0f} / on {iops('arcache-rand-ring'):,.0f} IOPS; "
    f"l2_ring_reads={st.get('l2_ring_reads')}",
    "",
    f"L2: l2_hits={st['l2_hits']} l2_misses={st['l2_misses']} l2_size={st['l2_size']} l2_asize={st['l2_asize']} "
    f"l2_hdr_size={st['l2_hdr_size']} l2_records={st['l2_records']} hdr bytes/record={st.get('l2_hdr_bytes_per_record', 0):.1f}",
    f"5M-record header measurement: {hdr}",
    "",
    "## Warm restart: 4K random reads at QD16 over the same 1 GiB, first 10 s after a restart",
    "| server | IOPS | mean latency ms |", "|---|---|---|",
    f"| arcache (L2 rebuilt from its log) | {iops('arcache-restart'):,.0f} | {lat_ms('arcache-restart'):.3f} |",
    f"| nbdkit cache filter (starts cold) | {iops('kit-restart'):,.0f} | {lat_ms('kit-restart'):.3f} |",
    f"arcache / nbdkit cache after restart = {iops('arcache-restart')/iops('kit-restart'):.1f}x; "
    f"arcache after restart / arcache warm = {iops('arcache-restart')/ai:.2f}x",
    "rebuild: " + " ".join(f"{k}={rs.get(k)}" for k in ["l2_rebuild_bufs", "l2_rebuild_log_blks", "l2_rebuild_ms", "l2_rebuild_success"]),
    (open(os.path.join(out, "l2arc-restart.txt")).read().strip() if os.path.exists(os.path.join(out, "l2arc-restart.txt")) else ""),
    "",
    f"memory: {mem}",
    "failed jobs: " + (open(os.path.join(out, "l2arc-failed.txt")).read().replace(chr(10), "; ") if os.path.exists(os.path.join(out, "l2arc-failed.txt")) else "none"),
]
text = "\n".join(lines)
print(text)
open(result, "w").write(text + "\n")

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
qds = [1, 2, 4, 8, 16, 32, 64]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
for who, label in [("arcache", "arcache (ARC 256M + L2 4G)"), ("origin", "origin alone (4 ms, 300 MB/s)")]:
    ax1.plot(qds, [iops(f"scale-{who}-qd{q}") for q in qds], marker="o", label=label)
    ax2.plot(qds, [lat_ms(f"scale-{who}-qd{q}") for q in qds], marker="o", label=label)
for ax, t, y in [(ax1, "4K random read, 1 GiB region: IOPS", "IOPS"), (ax2, "Average latency", "ms")]:
    ax.set_xscale("log", base=2); ax.set_xticks(qds); ax.set_xticklabels(qds)
    ax.set_xlabel("queue depth (outstanding requests)"); ax.set_ylabel(y); ax.set_title(t); ax.grid(alpha=.3)
ax2.set_yscale("log"); ax1.legend()
fig.tight_layout()
fig.savefig(plot, dpi=110)
PY
bench_publish "$work/l2arc-summary.md" "$result" "$work/l2arc-thread-scaling.png" "$plot"
echo "plot: $plot"
