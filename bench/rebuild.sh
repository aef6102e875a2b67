#!/usr/bin/env bash
# Rebuild rate of the persistent L2ARC: fills L2 with MILLIONS million 4K
# records through the real server, stops it, starts it again and reports
# how long the rebuild took (records per second), the time from starting
# the process to a rebuilt L2 (records per second from process start, the
# figure a user waits for), and the latency of reads served while it ran.
# The restart is repeated RUNS times (default 3) on the same L2.
#
#   bench/rebuild.sh [MILLIONS] [RUNS]      (default 4 3)
#
# Writes bench/results/rebuild-<MILLIONS>M.txt (commit and date at the top).
#
# The backing store is a sparse file, so its records are zeros and LZ4
# shrinks each to one 512-byte sector on L2: 4 million records take 2 GiB
# of L2 instead of 16 GiB. The rebuild reads the log blocks only, never the
# records, so its work is the same either way.
set -euo pipefail
cd "$(dirname "$0")/.."
MILLIONS=${1:-4}
RUNS=${2:-3}
# shellcheck source=bench/lib.sh
. bench/lib.sh
OUT=$(bench_results "rebuild-${MILLIONS}M.txt")
# Its own directory under $BENCH_DIR (a parent, as for every script of
# bench/lib.sh), emptied first: never $BENCH_DIR itself.
DIR=${BENCH_DIR:-/var/tmp}/arcache-rebuild
rm -rf "$DIR"; mkdir -p "$DIR"
PID=
# A run that fails leaves no server behind.
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; true' EXIT
# Everything the run prints goes to the terminal and to $DIR/result.txt,
# which is published as $OUT once the run has ended well: only a whole
# result replaces a published one. Fds 3 and 4 keep the terminal's
# stdout and stderr for the end.
exec 3>&1 4>&2
exec > >(tee "$DIR/result.txt") 2>&1
tee_pid=$!
bench_header "$MILLIONS" "$RUNS"
BIN=target/release/arcache
cargo build --release -q
RECORDS=$((MILLIONS * 1000 * 1000))
truncate -s $((RECORDS * 4096)) "$DIR/backing.img"
URI="nbd+unix:///?socket=$DIR/nbd.sock"
stat() { "$BIN" stat --json --control "$DIR/ctl.sock" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
serve() {
    "$BIN" serve --export "$DIR/backing.img" --recordsize 4K --arc-max 1G \
        --l2 "$DIR/l2.img:8G" --listen "unix:$DIR/nbd.sock" --control "$DIR/ctl.sock" \
        --set zfs_prefetch_disable=1 --set l2arc_rebuild_blocks_min_l2size=0 2>>"$DIR/serve.log" &
    PID=$!
    for _ in $(seq 200); do [ -S "$DIR/ctl.sock" ] && [ -S "$DIR/nbd.sock" ] && return; sleep 0.05; done
    echo "server did not start" >&2; exit 1
}
serve
echo "filling L2 with $RECORDS records..."
# --no-extents: the backing file is one hole, and with block status nbdcopy
# would skip it all and put nothing on L2.
nbdcopy --no-extents --requests=16 "$URI" null:
# The feed runs behind the reads: wait until it has written everything it can.
prev=-1
while :; do
    n=$(stat l2_records)
    [ "$n" = "$prev" ] && break
    prev=$n; sleep 2
done
echo "records on L2: $n"
[ "$n" -gt 0 ] || { echo "nothing reached L2; see $DIR/serve.log" >&2; kill "$PID"; exit 1; }
kill -TERM $PID; wait $PID; PID=
"$BIN" l2 dump "$DIR/l2.img" | tail -3

for run in $(seq "$RUNS"); do
echo "restarting (run $run of $RUNS)..."
: > "$DIR/serve.log"
t0=$(date +%s.%N)
serve
t_up=$(date +%s.%N)
# Reads during the rebuild: time 4K reads until it is done.
python3 - "$DIR" "$BIN" <<'PY'
import json, subprocess, sys, time
d, bin_ = sys.argv[1], sys.argv[2]
def st():
    return json.loads(subprocess.run([bin_, "stat", "--json", "--control", d + "/ctl.sock"], capture_output=True, check=True).stdout)
lat = []
while True:
    s = st()
    if not s["l2_rebuild_running"]:
        break
    t = time.time()
    r = subprocess.run(["qemu-io", "-r", "-f", "raw", f"nbd+unix:///?socket={d}/nbd.sock", "-c", "read -q 0 4k"], capture_output=True)
    if r.returncode != 0:
        sys.exit(f"a read during the rebuild failed: {r.stderr.decode()}")
    lat.append(time.time() - t)
s = st()
print(f"restored records      {s['l2_rebuild_bufs']}")
print(f"log blocks read       {s['l2_rebuild_log_blks']}")
print(f"rebuild time          {s['l2_rebuild_ms']} ms")
print(f"rebuild rate          {s['l2_rebuild_bufs'] / max(s['l2_rebuild_ms'], 1) * 1000:,.0f} records/s")
if lat:
    print(f"reads during rebuild  {len(lat)} (qemu-io, 4 KiB, incl. process start), median {sorted(lat)[len(lat)//2]*1000:.1f} ms")
else:
    print("reads during rebuild  none: the rebuild finished before the first stat")
PY
# The server logs the end of the rebuild; seeing that line (polled every
# 5 ms) ends the start-to-rebuilt time.
for _ in $(seq 12000); do grep -q "rebuild done" "$DIR/serve.log" && break; sleep 0.005; done
grep -q "rebuild done" "$DIR/serve.log" || { echo "no 'rebuild done' in $DIR/serve.log" >&2; kill "$PID"; exit 1; }
t_done=$(date +%s.%N)
up_s=$(python3 -c "print(f'{$t_up - $t0:.2f}')")
echo "server up (sockets answering) after $up_s s"
python3 -c "print(f'start to rebuilt      {$t_done - $t0:.3f} s ({$n / ($t_done - $t0):,.0f} records/s from process start)')"
kill -TERM $PID; wait $PID; PID=
grep -h "rebuild done" "$DIR/serve.log" | tail -1
done
# tee has written all the run printed once its input is closed and it has exited.
exec >&3 2>&4 3>&- 4>&-
wait "$tee_pid"
bench_publish "$DIR/result.txt" "$OUT"
