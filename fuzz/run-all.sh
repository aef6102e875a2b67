#!/usr/bin/env bash
# fuzz/run-all.sh [SECONDS [TARGET...]]: runs every fuzz target (each
# fuzz_targets/*.rs), or the TARGETs named, for SECONDS (default 30) from its
# committed seed corpus, and prints each one's executions per second.
#
# It fails, naming the target, when a target has no seed corpus, does not
# build, exits with an error, reports no executions, or leaves any artifact
# (crash-, oom-, leak-, timeout-, slow-unit-): anything libFuzzer saves is a
# finding. Findings are copied to fuzz/artifacts/TARGET/ to be turned into
# regression tests.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
if [ $# -gt 0 ]; then shift; fi
# The sanitizer and coverage flags are nightly's -Z flags; the stable
# toolchain every machine here has ships the sanitizer runtimes, and
# RUSTC_BOOTSTRAP lets it take those flags, so fuzzing never depends on a
# second toolchain being there.
export RUSTC_BOOTSTRAP=1
# The targets are built and run without cargo-fuzz, with the flags its
# `cargo fuzz build` (0.13) passes by default (see the build below):
# installing it took a minute of CI's budget on a new machine, to run one
# cargo command. libFuzzer's coverage counters and comparison tracing,
# AddressSanitizer, debug assertions and cfg(fuzzing); the release profile
# is fuzz/Cargo.toml's.
#
# FUZZ_SANITIZER=none (cargo fuzz's `-s none`) builds without
# AddressSanitizer, and so without LeakSanitizer's check after each input
# and libFuzzer's per-allocation limit (-malloc_limit_mb): a quarter less
# CPU to build (5 min 49 s of CPU against 7 min 41 s, two cores, no line
# tables) and runs 3 to 10 times as fast. What ASan catches is memory misuse
# in unsafe code. Ours that handles buffers (the IO ring, aligned buffers,
# the S3 body) is out of every target's reach; what config_parse reaches
# is libc calls with no pointer arithmetic (sysconf, geteuid, getgrnam on
# a configured group). Dependencies' unsafe code on fuzzed bytes (xxh3 in
# the decoders' checksums) goes unchecked too. A panic, an out-of-bounds
# index, a hang or RSS growth past -rss_limit_mb is still a finding.
# .ci/run uses it; any other value is AddressSanitizer, as cargo fuzz's
# default.
sanitizer=${FUZZ_SANITIZER:-address}
fuzz_rustflags=(
  -Cpasses=sancov-module
  -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
  -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares
  -Cllvm-args=-sanitizer-coverage-stack-depth
  -Cllvm-args=-simplifycfg-branch-fold-threshold=0
  --cfg fuzzing
  -Cdebug-assertions
  -Ccodegen-units=1
)
[ "$sanitizer" = none ] || fuzz_rustflags+=(-Zsanitizer=address)
# A single input running this long is a hang, not a slow path.
per_input_timeout=10

failed=()
fail() {
  echo "FUZZ FAILED: $1: $2" >&2
  failed+=("$1")
}

# fuzz/Cargo.lock is committed: a dependency added to a crate the fuzz
# targets build must be in it, or every fuzz build rewrites it (a stale lock
# once went unnoticed on main).
host=$(rustc -vV | sed -n 's/^host: //p')
if ! (cd fuzz && cargo metadata --locked --format-version 1 --filter-platform "$host" >/dev/null); then
  fail lockfile "fuzz/Cargo.lock is not current: run cargo update --workspace in fuzz/ and commit it"
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/fuzz_targets/*.rs; do
    targets+=("$(basename "$f" .rs)")
  done
fi

# Every target is built first, in one cargo run; the runs then only run,
# two at a time (FUZZ_JOBS): a fuzzer runs on one thread, and CI's budget
# is minutes.
jobs_max=${FUZZ_JOBS:-2}
results=$(mktemp -d)
bin_args=()
for t in "${targets[@]}"; do bin_args+=(--bin "$t"); done
# --target keeps the flags off build scripts and proc macros, as cargo-fuzz
# does; the binaries land in fuzz/target/HOST/release/. Unlike cargo-fuzz,
# no line tables: they cost 80 s of a two-core build (6 min 9 s against
# 4 min 48 s), and a finding's input replays with them under `cargo fuzz run`.
if ! RUSTFLAGS="${fuzz_rustflags[*]}" \
  cargo build --locked --release "${bin_args[@]}" --target "$host" --manifest-path fuzz/Cargo.toml \
  >"$results/build.log" 2>&1; then
  tail -30 "$results/build.log" >&2
  fail build "the fuzz targets' build failed (its log's end above)"
  exit 1
fi
bin_dir=fuzz/target/$host/release
# FUZZ_BUILD_ONLY=1: the build alone (.ci/run starts it early, at idle
# priority, and runs the targets later).
if [ -n "${FUZZ_BUILD_ONLY:-}" ]; then
  rm -rf "$results"
  # A stale fuzz/Cargo.lock (checked above) fails the build-only run too.
  [ ${#failed[@]} -eq 0 ] || exit 1
  echo "fuzz/run-all.sh: built ${targets[*]}"
  exit 0
fi

# Runs target $1; what it prints goes to $results/$1.out, and a failure's
# reason to $results/$1.failed.
fuzz_one() {
  local t=$1 corpus="fuzz/corpus/$1" out="$results/$1.out"
  if [ -z "$(ls -A "$corpus" 2>/dev/null)" ]; then
    echo "no seed corpus in $corpus" >"$results/$t.failed"
    return
  fi
  local work found log
  work=$(mktemp -d)
  found=$(mktemp -d)
  log=$(mktemp)
  # The run grows its corpus; the committed seeds stay as they are.
  cp -r "$corpus/." "$work/"
  local extra=()
  # The engine writes a txg with scoped threads, whose thread-local buffers
  # are freed after the join returns: LeakSanitizer's per-input check would
  # report them. Real leaks show as growth, which -rss_limit_mb catches.
  [ "$t" = engine_model ] && extra=(-detect_leaks=0 -rss_limit_mb=1024)
  local rc=0
  "$bin_dir/$t" "$work" -max_total_time="$secs" -timeout="$per_input_timeout" \
    -print_final_stats=1 -artifact_prefix="$found/" "${extra[@]}" >"$log" 2>&1 || rc=$?
  local execs rate
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  if [ -n "$(ls -A "$found")" ]; then
    mkdir -p "fuzz/artifacts/$t"
    cp "$found"/* "fuzz/artifacts/$t/"
    # libFuzzer's report (the panic, the sanitizer's summary) ends its log.
    tail -n 40 "$log" >"$out"
    echo "left $(ls "$found" | tr '\n' ' ')(copied to fuzz/artifacts/$t/)" >"$results/$t.failed"
  elif [ "$rc" -ne 0 ]; then
    tail -30 "$log" >"$out"
    echo "the fuzzer exited with status $rc (error above)" >"$results/$t.failed"
  elif [ -z "$execs" ] || [ "$execs" -eq 0 ]; then
    tail -30 "$log" >"$out"
    echo "ran no input" >"$results/$t.failed"
  else
    echo "fuzz $t: ${execs} executions, ${rate} exec/s, no findings" >"$out"
  fi
  rm -rf "$work" "$found" "$log"
}

# Waits for target $1's run (process $2). A run that exits with an error
# (a command of fuzz_one failed under set -e) fails its target, whatever it
# wrote before.
reap() {
  local rc=0
  wait "$2" || rc=$?
  if [ "$rc" -ne 0 ] && [ ! -f "$results/$1.failed" ]; then
    echo "its run exited with status $rc" >"$results/$1.failed"
  fi
}

echo "== fuzz ${targets[*]} for ${secs}s each, $jobs_max at a time, sanitizer: $sanitizer"
pids=()
for i in "${!targets[@]}"; do
  # Every run lasts about as long: the oldest ends first.
  if [ "$i" -ge "$jobs_max" ]; then
    reap "${targets[i - jobs_max]}" "${pids[i - jobs_max]}"
  fi
  fuzz_one "${targets[i]}" &
  pids+=($!)
done
for ((i = ${#targets[@]} > jobs_max ? ${#targets[@]} - jobs_max : 0; i < ${#targets[@]}; i++)); do
  reap "${targets[i]}" "${pids[i]}"
done
for t in "${targets[@]}"; do
  if [ -f "$results/$t.out" ]; then
    cat "$results/$t.out"
  fi
  if [ -f "$results/$t.failed" ]; then
    fail "$t" "$(cat "$results/$t.failed")"
  elif [ ! -f "$results/$t.out" ]; then
    fail "$t" "its run ended without a result"
  fi
done
rm -rf "$results"

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz/run-all.sh: ${#failed[@]} of ${#targets[@]} targets failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz/run-all.sh: all ${#targets[@]} targets ran ${secs}s with no findings"
