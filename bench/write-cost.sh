#!/usr/bin/env bash
# What durable L2 invalidation costs writes: 4K random writes at QD16 over a
# 256 MiB export whose records are partly on L2, with the L2 persistent and not.
# Usage: bench/write-cost.sh   (about 2 minutes; needs fio, nbdcopy)
# Write cost of durable invalidation: 4K random writes over records that are on L2.

D=/var/tmp/wb; rm -rf $D; mkdir -p $D
BIN="$(cd "$(dirname "$0")/.." && pwd)/target/release/arcache"
head -c 256M /dev/urandom > $D/backing.img
cat > "$D/fioparse.py" <<'PY'
import json, sys
j = json.load(sys.stdin)["jobs"][0]["write"]
print(f"write IOPS {j['iops']:.0f} mean lat {j['clat_ns']['mean']/1e6:.2f} ms")
PY
run() { # label minsize
  rm -f $D/l2.img $D/*.sock
  $BIN serve --export $D/backing.img --arc-max 32M --l2 $D/l2.img:1G --listen unix:$D/nbd.sock --control $D/ctl.sock \
     --set l2arc_feed_min_ms=10 --set l2arc_rebuild_blocks_min_l2size=$2 2>/dev/null & P=$!
  for i in $(seq 100); do [ -S $D/ctl.sock ] && break; sleep 0.05; done
  nbdcopy "nbd+unix:///?socket=$D/nbd.sock" null:
  sleep 5
  echo -n "$1: l2_records=$($BIN stat --json --control $D/ctl.sock | python3 -c 'import json,sys; print(json.load(sys.stdin)["l2_records"])') "
  fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$D/nbd.sock" --rw=randwrite --bs=4k --size=256M --iodepth=16 \
      --time_based --runtime=10 --output-format=json --output="$D/wb.json" >/dev/null 2>&1; python3 "$D/fioparse.py" < "$D/wb.json"
  $BIN stat --json --control $D/ctl.sock | python3 -c 'import json,sys; s=json.load(sys.stdin); print("   log commits", s["l2_log_commits"], "invalidated", s["l2_invalidated"])'
  kill $P; wait $P || true
}
run "L2 not persistent" 1T
run "L2 persistent    " 0
