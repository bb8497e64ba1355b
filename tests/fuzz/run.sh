#!/usr/bin/env bash
# run.sh [SECONDS] - fuzzes the front end for SECONDS (default 60) with libFuzzer + ASan + UBSan.
# Configures its own build directory (build-fuzz/ at the top of the tree, or $PTC_FUZZ_BUILD) with
# clang and PTC_FUZZ=ON, builds the harness, and runs it on a copy of the seed corpus (the
# examples, the golden error files and tests/fuzz/corpus/) with the dictionary ptm.dict.
# Exits non-zero if the fuzzer finds anything; the input that triggers it is left in
# BUILD/artifacts/ (reproduce with: BUILD/tests/fuzz/fuzz_frontend FILE).
set -euo pipefail
seconds=${1:-60}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${PTC_FUZZ_BUILD:-$root/build-fuzz}

mkdir -p "$build"
CC=${CC:-clang} cmake -S "$root" -B "$build" -G Ninja -DPTC_FUZZ=ON -DPTC_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 2; }
cmake --build "$build" --target fuzz_frontend

work=$build/fuzz-corpus
mkdir -p "$work" "$build/artifacts"
seeds=$build/fuzz-seeds
rm -rf "$seeds"
mkdir -p "$seeds"
cp "$here"/corpus/* "$root"/examples/*.ptm "$seeds"/ 2>/dev/null || true
for f in "$root"/tests/golden/*/*.ptm; do cp "$f" "$seeds/golden_$(basename "$f")"; done

"$build/tests/fuzz/fuzz_frontend" "$work" "$seeds" \
  -dict="$here/ptm.dict" -max_total_time="$seconds" -max_len=4096 -timeout=5 \
  -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/artifacts/"
