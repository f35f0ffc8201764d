#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan, the `fuzz` preset) and runs each for
# FUZZ_SECONDS (default 60) from its committed seed corpus. New inputs go to a scratch directory,
# never into the committed corpus. A crash, leak, timeout or sanitizer report fails the run and
# leaves the reproducer in build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-60}
cmake --preset fuzz >/dev/null
targets=()
for src in tests/fuzz/fuzz_*.c; do
  [ -e "$src" ] || continue
  targets+=("$(basename "$src" .c)")
done
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no fuzz targets"
  exit 0
fi
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"
mkdir -p build-fuzz/artifacts
status=0
for t in "${targets[@]}"; do
  short=${t#fuzz_}
  scratch=$(mktemp -d)
  echo "fuzz: $t for ${secs}s (corpus tests/fuzz/corpus/$short)"
  if ! UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       "build-fuzz/tests/fuzz/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 \
       "$scratch" "tests/fuzz/corpus/$short" > "build-fuzz/$t.log" 2>&1; then
    echo "fuzz: $t FAILED; see build-fuzz/$t.log"
    tail -40 "build-fuzz/$t.log"
    status=1
  else
    grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "build-fuzz/$t.log" | sed "s/^/fuzz: $t /"
  fi
  rm -rf "$scratch"
done
exit $status
