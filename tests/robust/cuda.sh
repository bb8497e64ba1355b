#!/usr/bin/env bash
# cuda.sh PTC PTC_TOKENIZE SOURCE_DIR - the CUDA path on a machine without a GPU (issue 15):
#   - `ptc --emit cuda` prints one translation unit that `nvcc --ptx` compiles for sm_80 and
#     sm_90 (where nvcc is installed; the unit test test_cuda compiles every kernel with NVRTC
#     and ptxas, and runs it through the host emulation);
#   - `--device cuda` without a driver exits 1 naming the missing driver library, before any
#     output is written (with a driver, it trains a step); a wrong --device value is a usage
#     error;
#   - --device cuda-emulated names a missing C compiler, and keeps the kernels it builds in a
#     disk cache that a later run loads (and rebuilds an object there that was cut short).
source "$(dirname "$0")/lib.sh"
nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc

check "ptc --emit cuda gpt2_tiny" 0 "" "$ptc" --emit cuda "$src/examples/gpt2_tiny.ptm"
cp out.txt gpt2_tiny.cu
# the unit the CUDA backend compiles: the generated (fused) kernels, gpt2_tiny's one attention
# shape (forward, statistics, two backward), and a kernel for each other kind of instruction
fused=$(( $("$ptc" --emit kernels "$src/examples/gpt2_tiny.ptm" | grep -c '^kernel ') + 4 ))
kernels=$(grep -c '^PTC_KERNEL ' gpt2_tiny.cu)
ops=$(grep -c '^PTC_KERNEL .* k_op[0-9]*_[0-9]*(' gpt2_tiny.cu)
[ "$kernels" -eq $((fused + ops)) ] && [ "$ops" -gt 0 ] \
  && ok "the fused kernels, 4 for attention and $ops for the other instructions" "$kernels" \
  || bad "the fused kernels, 4 for attention and the other instructions'" "$kernels CUDA kernels: $fused fused and attention, $ops op kernels"
if [ -x "$nvcc" ]; then
  for sm in 80 90; do
    check "nvcc --ptx -arch=sm_$sm of ptc --emit cuda" 0 "" "$nvcc" --ptx -arch=sm_$sm gpt2_tiny.cu -o g$sm.ptx
    n=$(grep -c '^\.visible \.entry k_' g$sm.ptx 2>/dev/null || echo 0)
    [ "$n" -eq "$kernels" ] && ok "sm_$sm PTX has every kernel" "$n entries" \
      || bad "sm_$sm PTX has every kernel" "$n entries for $kernels kernels"
  done
  # the kernels of parallel plans: tensor and data parallel, experts, pipeline stages, bf16, fp16
  for args in "--mesh dp=2,tp=2 examples/gpt2_tiny.ptm" "--mesh dp=2,ep=2 examples/moe_tiny.ptm" \
              "--mesh pp=2 -D batch=8 --microbatches 2 examples/gpt2_tiny.ptm" "--no-fuse examples/llama_tiny.ptm" \
              "--precision bf16 --mesh dp=2 examples/gpt2_tiny.ptm" "--precision fp16 examples/gpt2_tiny.ptm"; do
    # shellcheck disable=SC2086
    "$ptc" --emit cuda ${args/examples/$src/examples} > plan.cu 2> err.txt \
      && check "nvcc --ptx of ptc --emit cuda $args" 0 "" "$nvcc" --ptx -arch=sm_90 plan.cu -o plan.ptx \
      || bad "ptc --emit cuda $args" "$(head -c 300 err.txt)"
  done
else
  echo "SKIP nvcc --ptx: no $nvcc (the CUDA toolkit is not installed here)"
fi

check "ptc -o g" 0 "" "$ptc" "$src/examples/gpt2_tiny.ptm" -o g
if [ -e /dev/nvidiactl ] || ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  echo "SKIP --device cuda without a driver: this machine has an NVIDIA driver"
  check "--device cuda with a driver trains a step" 0 "" ./g --device cuda --steps 1 --quiet
else
  check "--device cuda without a driver names it" 1 "^\./g: error: --device cuda: the CUDA driver \(libcuda\.so\.1\) was not found" ./g --device cuda --steps 1 --save w.safetensors
  [ ! -s out.txt ] && [ ! -e w.safetensors ] && ok "--device cuda fails before any step" "" \
    || bad "--device cuda fails before any step" "$(head -c 200 out.txt)"
fi
check "--device with a wrong value" 2 "--device expects cpu, cuda or cuda-emulated, got 'gpu'" ./g --device gpu
check "--device cpu trains" 0 "" ./g --device cpu --steps 1 --threads 1

# --device cuda-emulated builds its kernels with the host's C compiler into a disk cache: without
# a compiler it says so; a build fills the cache; a later run loads from it and needs none
emu="env XDG_CACHE_HOME=$work/cache"
check "--device cuda-emulated without a C compiler names it" 1 \
  "^\./g: error: --device cuda-emulated needs a C compiler to build the kernels for the host \(cc, or \\\$CC\): cc failed" \
  $emu PATH=/nonexistent ./g --device cuda-emulated --steps 1 --quiet
check "--device cuda-emulated builds its kernels" 0 "" $emu ./g --device cuda-emulated --steps 1 --quiet
n=$(find "$work/cache/ptc/cuda-emulated" -name '*.so' | wc -l)
parts=$(find "$work/cache/ptc/cuda-emulated" -name '*.part' | wc -l)
[ "$n" -ge 1 ] && [ "$parts" -eq 0 ] && ok "the built kernels are in the cache" "$n shared objects" \
  || bad "the built kernels are in the cache" "$n shared objects, $parts part-written"
check "--device cuda-emulated loads cached kernels, no compiler needed" 0 "" \
  $emu PATH=/nonexistent ./g --device cuda-emulated --steps 1 --quiet
# an object cut short (a full disk, a copy) is built again, not mapped (which would be SIGBUS)
for f in "$work/cache/ptc/cuda-emulated"/*.so; do head -c 4096 "$f" > cut && cat cut > "$f"; done
check "--device cuda-emulated rebuilds a cached object cut short" 0 "" \
  $emu ./g --device cuda-emulated --steps 1 --quiet
small=$(find "$work/cache/ptc/cuda-emulated" -name '*.so' -size -5k | wc -l)
[ "$small" -eq 0 ] && ok "the cut objects were replaced" "" \
  || bad "the cut objects were replaced" "$small still 4 KiB"
finish
