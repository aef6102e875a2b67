#!/usr/bin/env bash
# Where a warm 4K random read's time goes when most reads hit L2: issue
# 21's warm random job (4K random reads at QD16 over 1 GiB, --arc-max 256M
# and an L2 file) over a local slow origin (nbdkit file plugin, delay
# 4 ms, rate 2400M), so that no Ceph daemon shares the two cores.
#
# Per round, after a warm-up run of the job: the timed run's IOPS and
# latency percentiles (fio's nbd engine; the fastest fifth or so are ARC
# hits, the rest L2 reads), what the device under the L2 file did
# (/proc/diskstats: reads/s, mean size, mean time, mean reads in flight),
# the CPU of the server's connection thread and of fio (from /proc, over
# the run's middle 8 s), and the machine's idle and IO-wait share
# (vmstat). Then the same device read directly (fio, io_uring, O_DIRECT,
# random) at the sizes the server reads (whole 16K records and 8K
# halves) and at queue depths 8 and 16: what the device gives at the
# depth the server keeps it at, and at the client's.
#
# The question it answers: is the job bound by the server's CPU, by the
# device, or by time spent between them?
#
# Usage: bench/l2-hit-anatomy.sh [SECONDS [ROUNDS]]  (defaults 15 and 3;
# about 2 minutes a round). Writes bench/results/l2-hit-anatomy.md.
set -euo pipefail
secs=${1:-15}; rounds=${2:-3}
for t in fio nbdkit python3 vmstat; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing (apt-get install fio nbdkit procps)" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"
cargo build --release --quiet --manifest-path "$here/Cargo.toml" -p arcache
bin="$here/target/release/arcache"
result=$(bench_results l2-hit-anatomy.md)
header=$(bench_header "$secs" "$rounds")
bench_start arcache-l2-anatomy

# The block device holding the work directory (and so the L2 file), by
# major:minor as /proc/diskstats names it.
IFS=: read -r major minor < <(findmnt -no MAJ:MIN -T "$work" | tr -d ' ')
disk=$(awk -v a="$major" -v b="$minor" '$1 == a && $2 == b {print $3}' /proc/diskstats)
[ -n "$disk" ] || { echo "bench: $work is on no block device (tmpfs?): set BENCH_DIR" >&2; exit 2; }
disk_stats() { awk -v d="$disk" '$3 == d {print $4, $6, $7}' /proc/diskstats; }
ticks() { awk '{print $14 + $15}' "$1"; }

head -c $((1 << 30)) /dev/urandom >"$work/origin.img"
nbdkit --foreground --exit-with-parent -U "$work/origin.sock" --filter=rate --filter=delay \
  file "$work/origin.img" rdelay=4ms rate=2400M & pids+=($!)
wait_sock "$work/origin.sock"

job() { # SECONDS [fio options...]: the client job, JSON in $work/fio.json
  timeout $(($1 + 120)) fio --name=job --ioengine=nbd --uri="nbd+unix:///?socket=$work/nbd.sock" \
    --rw=randread --bs=4k --size=1G --iodepth=16 --time_based --runtime="$1" --randseed=7 \
    --output-format=json --output="$work/fio.json" "${@:2}" >/dev/null 2>&1
}

: >"$work/rounds.jsonl"
for round in $(seq "$rounds"); do
  rm -f "$work/nbd.sock" "$work/ctl.sock" "$work/l2.img"
  "$bin" serve --export "nbd+unix:///?socket=$work/origin.sock" --arc-max 256M --l2 "$work/l2.img:4G" \
    --listen "unix:$work/nbd.sock" --control "$work/ctl.sock" >>"$work/serve.log" 2>&1 & arc=$!
  pids+=("$arc")
  wait_sock "$work/nbd.sock"; wait_sock "$work/ctl.sock"
  # Warm-up: long enough that the timed run finds every record on L2.
  job $((secs * 3))
  "$bin" stat --json --control "$work/ctl.sock" >"$work/s0.json"
  d0=$(disk_stats)
  vmstat 1 "$secs" >"$work/vm.txt" & vm=$!
  job "$secs" & fio_job=$!
  # The threads' CPU over the run's middle 8 seconds.
  sleep 3
  conn=$(grep -l '^nbd-conn' /proc/"$arc"/task/*/comm | head -1 | xargs dirname)
  # fio's job process: of the fio processes, the one that has worked most.
  client=$(for p in $(pgrep -x fio); do echo "$(ticks "/proc/$p/stat") $p"; done | sort -n | tail -1 | cut -d' ' -f2)
  c0=$(ticks "$conn/stat"); f0=$(ticks "/proc/$client/stat")
  sleep 8
  c1=$(ticks "$conn/stat"); f1=$(ticks "/proc/$client/stat")
  wait "$fio_job"; wait "$vm"
  d1=$(disk_stats)
  "$bin" stat --json --control "$work/ctl.sock" >"$work/s1.json"
  kill "$arc"; wait "$arc" || true
  python3 - "$work" "$secs" "$d0" "$d1" $((c1 - c0)) $((f1 - f0)) "$(getconf CLK_TCK)" >>"$work/rounds.jsonl" <<'PY'
import json, sys
w, secs = sys.argv[1], int(sys.argv[2])
d0, d1 = (list(map(int, x.split())) for x in sys.argv[3:5])
conn, client, tck = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
j = json.load(open(f"{w}/fio.json"))["jobs"][0]["read"]
b, a = json.load(open(f"{w}/s0.json")), json.load(open(f"{w}/s1.json"))
d = lambda k: a.get(k, 0) - b.get(k, 0)
rt = j["runtime"] / 1000
reads = d1[0] - d0[0]
vm = [l.split() for l in open(f"{w}/vm.txt").read().splitlines()[3:] if l.split()]
col = lambda i: sum(float(v[i]) for v in vm) / max(len(vm), 1)
pct = {float(k): v / 1000 for k, v in j["clat_ns"]["percentile"].items()}
print(json.dumps({
    "iops": j["iops"], "lat_us": j["lat_ns"]["mean"] / 1000,
    "p10": pct[10.0], "p20": pct[20.0], "p50": pct[50.0], "p90": pct[90.0], "p99": pct[99.0],
    "arc_hit_pct": 100 * d("demand_data_hits") / max(d("demand_data_hits") + d("demand_data_misses"), 1),
    "l2_hits": d("l2_hits"), "l2_partial": d("l2_partial_reads"), "origin_reads": d("l2_misses"),
    "dev_rps": reads / rt, "dev_kib": (d1[1] - d0[1]) / 2 / max(reads, 1),
    "dev_us": (d1[2] - d0[2]) * 1000 / max(reads, 1), "dev_inflight": (d1[2] - d0[2]) / 1000 / rt,
    "conn_cpu": conn / tck / 8, "fio_cpu": client / tck / 8,
    "idle": col(14), "iowait": col(15), "user": col(12), "system": col(13),
}))
PY
  tail -1 "$work/rounds.jsonl" >&2
done

# The device alone, on the L2 file's blocks (written by the rounds above).
: >"$work/raw.txt"
for bs in 16k 8k 4k; do
  for qd in 8 16; do
    fio --name=raw --filename="$work/l2.img" --size=1G --direct=1 --ioengine=io_uring --rw=randread \
      --bs=$bs --iodepth=$qd --runtime=8 --time_based --output-format=json --output="$work/raw.json" >/dev/null 2>&1
    python3 -c "import json, sys; j = json.load(open(sys.argv[1]))['jobs'][0]['read']; \
print(sys.argv[2], sys.argv[3], round(j['iops']), round(j['lat_ns']['mean'] / 1000))" "$work/raw.json" $bs $qd >>"$work/raw.txt"
  done
done

python3 - "$work/rounds.jsonl" "$work/raw.txt" "$header" "$secs" >"$work/result.md" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
raw = [l.split() for l in open(sys.argv[2])]
header, secs = sys.argv[3], sys.argv[4]
m = lambda k: st.median(r[k] for r in rows)
out = [header, "",
       "job: 1 GiB of random bytes behind nbdkit (file plugin, delay rdelay=4ms, rate 2400M) on a unix "
       "socket; `arcache serve --arc-max 256M --l2 FILE:4G`, default tunables; fio --ioengine=nbd "
       f"--rw=randread --bs=4k --iodepth=16 --size=1G, {3 * int(secs)} s of warm-up, then {secs} s timed. "
       f"Medians of {len(rows)} rounds, each with a fresh server.", "",
       "| round | IOPS | mean latency (us) | p10 / p20 / p50 / p90 / p99 (us) | ARC hit % | L2 reads of half a record | "
       "device reads/s | KiB each | device time per read (us) | reads in flight at the device | "
       "connection thread CPU | fio CPU | machine idle % | IO wait % |",
       "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for i, r in enumerate(rows, 1):
    out.append(f"| {i} | {r['iops']:,.0f} | {r['lat_us']:.0f} | {r['p10']:.0f} / {r['p20']:.0f} / {r['p50']:.0f} / "
               f"{r['p90']:.0f} / {r['p99']:.0f} | {r['arc_hit_pct']:.1f} | "
               f"{100 * r['l2_partial'] / max(r['l2_hits'], 1):.0f} % | {r['dev_rps']:,.0f} | {r['dev_kib']:.1f} | "
               f"{r['dev_us']:.0f} | {r['dev_inflight']:.1f} | {r['conn_cpu']:.2f} | {r['fio_cpu']:.2f} | "
               f"{r['idle']:.0f} | {r['iowait']:.0f} |")
out += ["", "The device read directly (fio, io_uring, O_DIRECT, random, on the L2 file):", "",
        "| read size | queue depth | IOPS | mean latency (us) |", "|---|---:|---:|---:|"]
out += [f"| {b} | {q} | {int(i):,} | {l} |" for b, q, i, l in raw]
l2_share = 1 - m("arc_hit_pct") / 100
elsewhere = m("p50") - m("dev_us")
out += ["",
        f"Reading it: {100 * l2_share:.0f} % of the reads go to L2. The median read ({m('p50'):.0f} us) is an L2 read, "
        f"of which the device's own time is {m('dev_us'):.0f} us; the other {elsewhere:.0f} us are spent between "
        f"fio, the socket and the server's connection thread, which keeps {m('dev_inflight'):.1f} of fio's 16 reads "
        f"at the device. The connection thread uses {m('conn_cpu'):.2f} of a core and fio {m('fio_cpu'):.2f}; "
        f"the machine is {m('idle') + m('iowait'):.0f} % idle (IO wait included)."]
if m("conn_cpu") < 0.9 and m("idle") + m("iowait") > 30:
    out[-1] += (" Neither the server nor the client is short of CPU: the job is bound by the device's time "
                "per read at the depth the pipeline keeps it at, and by the time between.")
else:
    out[-1] += " The connection thread or the machine is short of CPU: the job is bound by CPU."
print("\n".join(out))
PY
# Only a whole result replaces a published one.
bench_publish "$work/result.md" "$result"
cat "$result"
