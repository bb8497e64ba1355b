#!/usr/bin/env bash
# tsan.sh - ThreadSanitizer over the runtime's threads: ptc and its runner built with
# -fsanitize=thread (build-tsan/, or $PTC_TSAN_BUILD), then a few short trainings that run
# every kind of thread the runtime has: the CPU pool (--threads 2) on the jit and cpu backends,
# ranks as threads over the in-process communicator (dp x tp with SP and ZeRO-3, pipeline,
# experts, bf16, f32 GEMMs split into bf16 ones), and ranks sharing one emulated GPU and its emulated NCCL. Any report fails
# it (exit 66 from the run that had it), with the report printed.
#
# Criterion's test runner crashes under ThreadSanitizer, so the unit tests are not run here;
# GCC's function multiversioning (target_clones: an ifunc resolver run before ThreadSanitizer
# is ready) is off in this build (cpu_internal.h).
#   tools/tsan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${PTC_TSAN_BUILD:-$root/build-tsan}
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPTC_TESTS=OFF \
  -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
cmake --build "$build" -j "$jobs" --target ptc
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ptc=$build/tools/ptc
ex=$root/examples
n=0
run() { # run NAME ENV "PTC ARGS" "RUN ARGS"
  local name=$1 env=$2 cargs=$3 rargs=$4
  n=$((n + 1))
  # shellcheck disable=SC2086
  "$ptc" $cargs -o "$work/m$n" >"$work/c$n.log" 2>&1 || { cat "$work/c$n.log"; exit 1; }
  # shellcheck disable=SC2086
  if ! env $env "$work/m$n" --steps 2 --threads 2 --quiet $rargs >"$work/r$n.log" 2>&1; then
    echo "tsan: $name failed:"
    cat "$work/r$n.log"
    exit 66
  fi
  echo "ok   $name"
}
run "gpt2_tiny, jit, 2 threads" "" "$ex/gpt2_tiny.ptm" ""
run "gpt2_tiny, cpu, 2 threads" "" "$ex/gpt2_tiny.ptm" "--backend cpu"
run "gpt2_tiny dp=2,tp=2 SP ZeRO-3" "" "$ex/gpt2_tiny.ptm --mesh dp=2,tp=2 --seq-parallel --zero 3" ""
run "gpt2_tiny pp=2,dp=2 2 microbatches ZeRO-1" "" \
  "$ex/gpt2_tiny.ptm --mesh pp=2,dp=2 --microbatches 2 --zero 1" ""
run "moe_tiny dp=2,ep=2" "" "$ex/moe_tiny.ptm --mesh dp=2,ep=2" ""
# the f32 GEMMs split into bf16 ones (each rank thread's own scratch, the pool joining parts)
run "gpt2_tiny dp=2,tp=2 --matmul-precision high" "" "$ex/gpt2_tiny.ptm --mesh dp=2,tp=2" \
  "--matmul-precision high"
run "llama_tiny tp=2 SP bf16" "" "$ex/llama_tiny.ptm --mesh tp=2 --seq-parallel --precision bf16" ""
run "gpt2_tiny dp=2,tp=2 on one emulated GPU" "" \
  "$ex/gpt2_tiny.ptm --mesh dp=2,tp=2 --seq-parallel --zero 3" "--device cuda-emulated"
run "gpt2_tiny pp=2,dp=2 on two emulated GPUs" "PTC_CUDA_EMULATED_GPUS=2" \
  "$ex/gpt2_tiny.ptm --mesh pp=2,dp=2 --microbatches 2 --zero 1" "--device cuda-emulated"
echo "tsan: no reports in $n runs"
