#!/usr/bin/env bash
# gpu_sanitize.sh PTC TOOL - compute-sanitizer --tool TOOL (memcheck, racecheck, synccheck) over
# one step on the GPU of four plans: gpt2_tiny dp=2,tp=2 with SP (4 ranks on one GPU: the device
# communicator's kernels, every rank's module), llama_tiny at seq 80 (grouped-query attention
# across two key tiles), the same in bf16 (the tensor-core attention's shared tiles), and moe_tiny
# dp=2,ep=2 (4 ranks on one GPU: cuda_moe.c's routing and row kernels, all_to_all_v in GPU memory).
# Exit 0 when the tool finds nothing, 9 when it reports errors, 77 when there is no
# compute-sanitizer. bench/gpu_check.sh runs it on a lent GPU.
set -u -o pipefail
ptc=$1 tool=$2
root=$(cd "$(dirname "$0")/.." && pwd)
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$san" ] || { echo "gpu_sanitize: no compute-sanitizer"; exit 77; }
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
"$ptc" "$root/examples/gpt2_tiny.ptm" -D batch=2 -D seq=8 --mesh dp=2,tp=2 --seq-parallel \
  -o "$w/gpt2_dp2tp2" > /dev/null || exit 1
"$ptc" "$root/examples/llama_tiny.ptm" -D batch=2 -D seq=80 -o "$w/llama_s80" > /dev/null || exit 1
"$ptc" "$root/examples/llama_tiny.ptm" -D batch=2 -D seq=80 --precision bf16 \
  -o "$w/llama_s80_bf16" > /dev/null || exit 1
"$ptc" "$root/examples/moe_tiny.ptm" -D batch=4 -D seq=8 --mesh dp=2,ep=2 \
  -o "$w/moe_dp2ep2" > /dev/null || exit 1
rc=0
for x in gpt2_dp2tp2 llama_s80 llama_s80_bf16 moe_dp2ep2; do
  echo "== $tool: $x"
  "$san" --tool "$tool" --error-exitcode 9 "$w/$x" --device cuda --steps 1 --threads 1 2>&1 |
    tail -n 12
  r=$?
  [ "$r" -eq 0 ] || rc=$r
done
exit $rc
