#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 30) from its seed corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
for t in zil_decode l2_decode trace_parsers nbd_session config_parse engine_model; do
  mkdir -p "fuzz/corpus/$t"
  work=$(mktemp -d)
  cp -r "fuzz/corpus/$t/." "$work/"
  echo "== fuzz $t for ${secs}s"
  extra=()
  # The engine writes a txg with scoped threads, whose thread-local buffers
  # are freed after the join returns: LeakSanitizer's per-input check would
  # report them. Its real leaks would show as growth, which -rss_limit_mb catches.
  [ "$t" = engine_model ] && extra=(-detect_leaks=0 -rss_limit_mb=1024)
  cargo +nightly fuzz run "$t" "$work" -- -max_total_time="$secs" -print_final_stats=1 "${extra[@]}" 2>&1 \
    | grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|ERROR|panicked|Done" || true
  rm -rf "$work"
  # A crash leaves fuzz/artifacts/$t/crash-*: fail loudly.
  if ls "fuzz/artifacts/$t"/crash-* >/dev/null 2>&1; then
    echo "fuzz target $t found a crash: fuzz/artifacts/$t" >&2
    exit 1
  fi
done
