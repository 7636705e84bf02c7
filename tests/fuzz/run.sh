#!/usr/bin/env bash
# tests/fuzz/run.sh BUILD_DIR SECONDS - run every harness built in BUILD_DIR
# (one per tests/fuzz/fuzz_*.c) for SECONDS each, one after the other, from
# its seeds (tests/fuzz/corpus/NAME) and its dictionary (tests/fuzz/NAME.dict)
# when there is one. New inputs go to BUILD_DIR/corpus/NAME (kept between
# runs, never into the repository); crashes, leaks, timeouts and sanitizer
# reports to BUILD_DIR/artifacts/, and the run fails. A run's statistics
# (execs, execs/s, cov, ft) end up in BUILD_DIR/logs/NAME.log.
# Environment: FUZZ_TIMEOUT (seconds one input may take, default 60: an
# input runs in milliseconds, but a niced run on a busy machine can be
# starved for seconds, and 10 s gave a false timeout), FUZZ_FLAGS extra
# libFuzzer flags.
set -uo pipefail
build=${1:?usage: run.sh BUILD_DIR SECONDS}
secs=${2:?usage: run.sh BUILD_DIR SECONDS}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$build/corpus" "$build/artifacts" "$build/logs"
failed=()
shopt -s nullglob
for src in "$here"/fuzz_*.c; do
  name=$(basename "$src" .c)
  short=${name#fuzz_}
  bin="$build/$name"
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is not built (run cmake --build $build)" >&2
    failed+=("$name (not built)")
    continue
  fi
  seeds="$here/corpus/$short"
  work="$build/corpus/$short"
  mkdir -p "$work"
  args=(-max_total_time="$secs" -print_final_stats=1 -timeout="${FUZZ_TIMEOUT:-60}" -rss_limit_mb=4096
        -artifact_prefix="$build/artifacts/$name-")
  [ -f "$here/$short.dict" ] && args+=(-dict="$here/$short.dict")
  dirs=("$work")
  [ -d "$seeds" ] && dirs+=("$seeds")
  log="$build/logs/$name.log"
  echo "fuzz: $name for ${secs}s (log $log)"
  # shellcheck disable=SC2086
  "$bin" "${args[@]}" ${FUZZ_FLAGS:-} "${dirs[@]}" >"$log" 2>&1
  rc=$?
  grep -E '^stat::|^#[0-9]+[[:space:]]+DONE' "$log" | sed "s/^/  $name: /"
  if [ $rc -ne 0 ]; then
    echo "fuzz: $name FAILED (exit $rc); the report:" >&2
    grep -E -A30 'ERROR: |runtime error|contract broken|Test unit written' "$log" | head -60 >&2
    failed+=("$name")
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: every harness ran ${secs}s without a finding"
