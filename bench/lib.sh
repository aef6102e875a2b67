# Sourced by bench scripts: a work directory that is removed at exit along
# with every background process recorded in `pids`, and a wait for a socket.

# bench_start PREFIX: sets `work` (under $BENCH_DIR, default /var/tmp) and `pids`.
bench_start() {
  work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/$1.XXXXXX")
  pids=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}

wait_sock() { for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

# bench_header ARGS...: the first line of a result file in bench/results/.
# A published figure is only worth what this line lets a reader redo: the
# script and its arguments, the commit the binary was built from ("-dirty"
# when tracked files differ from it, result files aside, since the scripts
# write those themselves), when it ran (UTC) and on how many cores.
bench_header() {
  local root commit name when cores
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  commit=$(git -C "$root" rev-parse --short HEAD)
  # A file rewritten with the same bytes (cargo fmt, a checkout) has new
  # stat data that `git diff --quiet` counts as a change until the index
  # is refreshed.
  git -C "$root" update-index -q --refresh >/dev/null 2>&1 || true
  git -C "$root" diff --quiet HEAD -- . ':(exclude)bench/results' || commit="$commit-dirty"
  # These on their own lines, each checked: most callers run this inside
  # $(...), where set -e does not reach, and an empty field would go into
  # a result.
  name=$(basename "$0") || return 1
  when=$(date -u '+%Y-%m-%d %H:%M UTC') || return 1
  cores=$(nproc) || return 1
  echo "# bench/$name${*:+ $*} at commit $commit, $when, $cores cores"
}

# bench_arms ARM...: one line per A/B arm naming the commit its binary was
# built from, as the binary itself reports it (`arcache --version`), so a
# result never rests on a file name; "commit unknown" for a build from
# before f6a1179's successor, which did not record it.
bench_arms() {
  local arm bin built
  for arm in "$@"; do
    bin=${arm%% *}
    built=$("$bin" --version 2>/dev/null | sed -n 's/.*(commit \(.*\)).*/\1/p')
    echo "- arm \`$arm\`: built from commit ${built:-unknown}"
  done
}

# bench_results NAME: the path of a published result file (bench/results/NAME).
bench_results() {
  local dir
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/results"
  mkdir -p "$dir"
  echo "$dir/$1"
}

# bench_publish FILE DEST [FILE DEST]...: puts each finished result FILE
# (built in the work directory) at its DEST, a path from bench_results,
# whole: a result file is written whole or not at all, so a run that fails
# before this leaves every DEST as it was. Each FILE is copied beside its
# DEST under a temporary name, and only once every copy is made are they
# renamed over their DESTs: a plain `mv` from a work directory on another
# file system removes DEST and writes it anew in place, so a run stopped
# mid-copy would leave half a result there. Call it once the FILEs hold
# everything; it fails (the temporary copies removed, the DESTs as they
# were unless a rename, after every copy, fails) if a copy or rename does.
# A run killed mid-copy can leave a .DEST.partial.PID beside DEST, never
# half a DEST.
bench_publish() {
  local args=("$@") tmps=() i
  [ $(($# % 2)) = 0 ] && [ $# -gt 0 ] || { echo "bench_publish FILE DEST [FILE DEST]..." >&2; return 2; }
  for ((i = 0; i < $#; i += 2)); do
    tmps+=("$(dirname "${args[i + 1]}")/.$(basename "${args[i + 1]}").partial.$$")
    cp "${args[i]}" "${tmps[-1]}" || { rm -f "${tmps[@]}"; return 1; }
  done
  for ((i = 0; i < $#; i += 2)); do
    mv -f "${tmps[i / 2]}" "${args[i + 1]}" || { rm -f "${tmps[@]}"; return 1; }
  done
}

# bench_ab_results NAME: bench_results for an A/B script. A named A/B
# (AB_NAME set) records one comparison, so a result file of that name that
# exists is not replaced unless AB_OVERWRITE=1: a name reused by mistake
# once overwrote an earlier session's cited results. Fails (status 2)
# before anything runs; call as `result=$(bench_ab_results X) || exit 2`.
bench_ab_results() {
  local path
  path=$(bench_results "$1")
  if [ -n "${AB_NAME:-}" ] && [ -e "$path" ] && [ "${AB_OVERWRITE:-0}" != 1 ]; then
    echo "bench: $path exists; choose another AB_NAME or set AB_OVERWRITE=1" >&2
    return 2
  fi
  echo "$path"
}

# slow_source IMG: mounts the ext4 image IMG as issue 22's slow source at
# $work/slow: a direct-IO loop device with no read-ahead over nbdfuse (at
# $work/nbdf) over `nbdkit --filter=delay rdelay=4ms wdelay=4ms`, so every
# block read costs 4 ms like a seek. Sets `loop` (the caller detaches it).
slow_source() {
  nbdfuse "$work/nbdf" --command nbdkit -s --filter=delay file "$1" rdelay=4ms wdelay=4ms & pids+=($!)
  for _ in $(seq 200); do [ -e "$work/nbdf/nbd" ] && break; sleep 0.05; done
  loop=$(losetup -f --show --direct-io=on "$work/nbdf/nbd")
  blockdev --setra 0 "$loop"
  mount -o inode_readahead_blks=0 "$loop" "$work/slow"
}

# wait_l2_feed STILL MAX: until the L2 feed of the server whose `stat_field`
# the caller defines has written what it will: its size still for STILL
# seconds in a row, its log committed (at most MAX seconds).
wait_l2_feed() {
  local last=-1 still=0 now
  for _ in $(seq "$2"); do
    now=$(stat_field l2_size)
    if [ "$now" = "$last" ] && [ "$(stat_field l2_log_uncommitted_bytes)" = 0 ]; then
      still=$((still + 1))
      [ "$still" -ge "$1" ] && return 0
    else
      still=0
    fi
    last=$now
    sleep 1
  done
}

# bench_ceph_up MON_PORT RGW_PORT OSD_BYTES: a one-node Ceph with RGW
# (tests/ceph/ceph-up.sh) in $work/ceph, stopped with the script; sets `ep`
# (RGW's endpoint) and exports the credentials and endpoint every S3 tool
# here takes.
bench_ceph_up() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  echo "bench: starting Ceph" >&2
  CEPH_UP_MON_PORT=$1 CEPH_UP_RGW_PORT=$2 CEPH_UP_OSD_BYTES=$3 CEPH_UP_EXIT_WITH_PARENT=1 \
    bash "$root/tests/ceph/ceph-up.sh" "$work/ceph" >"$work/ceph.log" 2>&1 & pids+=($!)
  for _ in $(seq 600); do grep -q "ceph up" "$work/ceph.log" && break; sleep 0.2; done
  grep -q "ceph up" "$work/ceph.log" || { cat "$work/ceph.log" >&2; echo "bench: Ceph did not start" >&2; exit 1; }
  ep=http://127.0.0.1:$2
  export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=testtesttest AWS_ENDPOINT_URL=$ep AWS_REGION=us-east-1
  unset AWS_PROFILE
}
