#!/usr/bin/env bash
# The long soak (issue 7): 64 NBD connections over four exports with L2 and
# an intent log, verified reads, writes, zeroings and flushes, for SECONDS
# (default 300). CI runs the same test for 8 s. Prints requests, bytes
# verified, peak RSS against arc_max + zfs_dirty_data_max, fds and threads.
# Usage: bench/soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ARCACHE_SOAK_SECS=${1:-300} cargo test --release -p arcache --test soak -- --nocapture 2>&1 \
  | grep -E "^soak |test result|panicked"
