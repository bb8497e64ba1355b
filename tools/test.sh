#!/usr/bin/env bash
# test.sh - sets up and runs the whole test suite: the build and every ctest test (unit, golden,
# training, PyTorch comparison), then the same suite under AddressSanitizer + UndefinedBehavior-
# Sanitizer, then short trainings under ThreadSanitizer (tools/tsan.sh: the CPU pool, ranks as
# threads, ranks sharing an emulated GPU), then the fuzzers for a short run (tests/fuzz/run.sh).
# CI runs exactly this.
#   tools/test.sh [--quick]     --quick skips the sanitizer builds and the fuzzer
set -euo pipefail
cd "$(dirname "$0")/.."
quick=${1:-}
jobs=$(nproc 2>/dev/null || echo 2)

echo "== build and test =="
tools/setup.sh build -DPTC_WERROR=ON
ctest --test-dir build --output-on-failure -j "$jobs"

if [ "$quick" != --quick ]; then
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer =="
  # (-O1: AddressSanitizer's advice for a reasonable speed)
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" \
    -DPTC_SANITIZE=ON -DPTC_WERROR=ON >/dev/null
  cmake --build build-asan -j "$jobs"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  # the full equivalence matrix ran above; under the sanitizers a subset keeps CI short
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE "slow|equivalence"
  python3 tests/equivalence/matrix.py build-asan/tools/ptc --quick

  echo "== ThreadSanitizer =="
  tools/tsan.sh

  echo "== fuzzers: front end, compiler, flags, checkpoints, token files, safetensors (120 s) =="
  tests/fuzz/run.sh 120
fi
echo "== all tests passed =="
