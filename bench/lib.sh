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
