#!/usr/bin/env bash
# run.sh [SECONDS] [TARGET...] - fuzzes with libFuzzer + ASan + UBSan for SECONDS in all (default
# 120), shared among the TARGETs by weight (default: all of them):
#   frontend     .ptm text (seeds: the examples, the golden files, corpus/; dictionary ptm.dict)
#   compile      .ptm text through the passes to a checked plan, on 11 meshes and settings
#                (seeds: the examples, the equivalence models, the golden files' models)
#   flags        the command lines of ptc and of the executables (seeds: corpus_flags/;
#                dictionary flags.dict)
#   checkpoint   checkpoints given to --resume / --init-from, and DIR/latest
#   data         token files given to --data
#   safetensors  the safetensors reader alone
# The file harnesses write their own seeds (PTC_FUZZ_SEEDS=DIR) from the library, so the seeds
# follow the format. Configures its own build directory (build-fuzz/ at the top of the tree, or
# $PTC_FUZZ_BUILD) with clang and PTC_FUZZ=ON. Exits non-zero if a fuzzer finds anything; the
# input that triggers it is left in BUILD/artifacts/TARGET/ (reproduce with:
# BUILD/tests/fuzz/fuzz_TARGET FILE).
set -euo pipefail
seconds=${1:-120}
shift || true
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${PTC_FUZZ_BUILD:-$root/build-fuzz}
all=(frontend compile flags checkpoint data safetensors)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
declare -A weight=([frontend]=3 [compile]=3 [flags]=3 [checkpoint]=2 [data]=1 [safetensors]=1)
total=0
for t in "${targets[@]}"; do
  [ -n "${weight[$t]:-}" ] || { echo "run.sh: unknown target '$t' (${all[*]})" >&2; exit 2; }
  total=$((total + weight[$t]))
done

mkdir -p "$build"
CC=${CC:-clang} cmake -S "$root" -B "$build" -G Ninja -DPTC_FUZZ=ON -DPTC_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 2; }
cmake --build "$build" --target "${targets[@]/#/fuzz_}"

for t in "${targets[@]}"; do
  secs=$((seconds * weight[$t] / total))
  [ "$secs" -ge 1 ] || secs=1
  bin=$build/tests/fuzz/fuzz_$t
  work=$build/fuzz-corpus/$t seeds=$build/fuzz-seeds/$t
  mkdir -p "$work" "$build/artifacts/$t"
  rm -rf "$seeds"
  mkdir -p "$seeds"
  args=(-max_len=4096)
  case $t in
    frontend)
      cp "$here"/corpus/* "$root"/examples/*.ptm "$seeds"/ 2> /dev/null || true
      for f in "$root"/tests/golden/*/*.ptm; do cp "$f" "$seeds/golden_$(basename "$f")"; done
      args+=(-dict="$here/ptm.dict") ;;
    compile)
      cp "$root"/examples/*.ptm "$root"/tests/equivalence/*.ptm "$seeds"/
      for f in "$root"/tests/golden/*/*.ptm; do cp "$f" "$seeds/golden_$(basename "$f")"; done
      args+=(-dict="$here/ptm.dict") ;;
    flags)
      cp "$here"/corpus_flags/* "$seeds"/
      args+=(-dict="$here/flags.dict") ;;
    checkpoint | safetensors)
      PTC_FUZZ_SEEDS=$seeds "$build/tests/fuzz/fuzz_checkpoint"
      find "$seeds" -type d -empty -delete
      args=(-max_len=65536) ;;
    data)
      PTC_FUZZ_SEEDS=$seeds "$bin"
      args=(-max_len=8192) ;;
  esac
  echo "== fuzz_$t for $secs s =="
  "$bin" "$work" "$seeds" "${args[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t/" 2>&1 | tail -n 12
done
