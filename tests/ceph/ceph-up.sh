#!/bin/bash
# tests/ceph/ceph-up.sh DIR: a throwaway one-node Ceph 16.2 (Debian 12's
# ceph-mon, ceph-osd, radosgw): a monitor, one OSD on memstore (data in
# RAM, 2 GiB at most), and an RGW; auth none, loopback only. Creates the
# pool rbd and the image rbd/disk0 (1 GiB); about 17 s to start.
#   apt-get install -y --no-install-recommends ceph-mon ceph-osd ceph-common radosgw librbd-dev librados-dev
#
# Environment:
#   CEPH_UP_MON_PORT   the monitor's port (default 3300)
#   CEPH_UP_RGW        0: no RGW (the RBD tests need none)
#   CEPH_UP_RGW_PORT   RGW's port (default 7480)
#   CEPH_UP_OSD_BYTES  the memstore OSD's size in bytes (default 2 GiB)
#   CEPH_UP_EXIT_WITH_PARENT=1: stay in the foreground once up and stop the
#       cluster (and remove DIR) when the process that started this script
#       exits, however it exits (the tests use this: a killed test binary
#       leaves no daemon behind); the daemons also die with this script.
# Otherwise the script returns once the cluster is up; stop it by killing
# the pids in DIR/run/*.pid (ceph-mon, ceph-osd, radosgw), then rm -rf DIR.
#
# Notes: with auth none, `ms mon client mode = crc` is needed (else radosgw
# hangs 300 s), and RGW's beast frontend needs tcp_nodelay=1 (else about
# 44 ms per small GET).
set -euo pipefail
C=${1:?usage: ceph-up.sh DIR}
MON_PORT=${CEPH_UP_MON_PORT:-3300}
RGW=${CEPH_UP_RGW:-1}
RGW_PORT=${CEPH_UP_RGW_PORT:-7480}
WITH_PARENT=${CEPH_UP_EXIT_WITH_PARENT:-0}
PARENT=$PPID
rm -rf "$C"
mkdir -p "$C"/{mon-a,osd-0,run,log,rgw-a}
C=$(cd "$C" && pwd)
cd "$C"

pids=()
up=0
stop() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
if [ "$WITH_PARENT" = 1 ]; then
  trap 'stop; rm -rf "$C"' EXIT
else
  # A failed start leaves nothing running.
  trap '[ "$up" = 1 ] || stop' EXIT
fi
trap 'exit 1' TERM INT HUP

# NAME CMD...: a daemon in the foreground of a child of this script, its
# output in log/NAME.out; with a parent to follow, it dies with the script.
daemon() {
  local name=$1
  shift
  if [ "$WITH_PARENT" = 1 ] && command -v setpriv >/dev/null; then
    setpriv --pdeathsig KILL -- "$@" >"log/$name.out" 2>&1 &
  else
    "$@" >"log/$name.out" 2>&1 &
  fi
  pids+=($!)
  echo $! >"run/$name.pid"
}

FSID=$(uuidgen)
cat >ceph.conf <<CONF
[global]
fsid = $FSID
mon host = v2:127.0.0.1:$MON_PORT
public network = 127.0.0.0/8
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms client mode = crc
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = ${CEPH_UP_OSD_BYTES:-2147483648}
run dir = $C/run
log file = $C/log/\$name.log
admin socket = $C/run/\$name.asok
mon data = $C/mon-\$id
osd data = $C/osd-\$id
[client]
# Many clients at once (rbd, arcache): no admin socket each, which would
# collide on one path.
admin socket =
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT tcp_nodelay=1
rgw data = $C/rgw-a
CONF
monmaptool --create --addv a "[v2:127.0.0.1:$MON_PORT]" --fsid "$FSID" monmap >/dev/null
ceph-mon -c ceph.conf --mkfs -i a --monmap monmap
daemon mon.a ceph-mon -f -c ceph.conf -i a
U=$(uuidgen)
ceph -c ceph.conf osd new "$U" >/dev/null
ceph-osd -c ceph.conf -i 0 --mkfs --osd-uuid "$U" 2>/dev/null
daemon osd.0 ceph-osd -f -c ceph.conf -i 0
until ceph -c ceph.conf osd stat 2>/dev/null | grep -q "1 up"; do sleep 0.5; done
ceph -c ceph.conf osd pool create rbd 8 >/dev/null 2>&1
ceph -c ceph.conf osd pool application enable rbd rbd >/dev/null 2>&1
rbd -c ceph.conf create --size 1G rbd/disk0
s3=""
if [ "$RGW" != 0 ]; then
  daemon client.rgw.a radosgw -f -c ceph.conf -n client.rgw.a --no-mon-config
  until curl -s -o /dev/null "http://127.0.0.1:$RGW_PORT/"; do sleep 0.2; done
  radosgw-admin -c ceph.conf user create --uid=test --display-name=test --access-key=test \
    --secret=testtesttest >/dev/null 2>&1
  s3="; S3 http://127.0.0.1:$RGW_PORT key test/testtesttest"
fi
up=1
echo "ceph up: conf $C/ceph.conf; rbd/disk0 1G$s3"
if [ "$WITH_PARENT" = 1 ]; then
  # The EXIT trap stops the daemons and removes DIR.
  while kill -0 "$PARENT" 2>/dev/null; do sleep 0.5; done
fi
