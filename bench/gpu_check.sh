#!/usr/bin/env bash
# gpu_check.sh [PTC] - what issue 15 asks of a lent GPU, as one command that records itself.
#
#   1. tests/train/cuda_emulated.py --device cuda: every model and mesh of the emulated run on the
#      real GPU against the CPU backend (losses and gradient norms of 3 steps within 1e-5, 2e-3 in
#      16 bits); on a one-GPU machine the dp=2,tp=2 plan runs as 4 ranks on that GPU through the
#      device communicator, the issue's "4 ranks on one GPU equals the CPU run";
#   2. bench/cuda_train.py: GPT-2 124M, batch 16 x 1024, bf16, tok/s and MFU, against PyTorch on
#      the same GPU where it is installed (it writes its own bench/results file); then fp32 with
#      TF32 GEMMs on both sides (--matmul-precision high: never run on a GPU before);
#   3. bench/gpu_sanitize.sh: compute-sanitizer's memcheck and racecheck over a step of 4 ranks
#      on the GPU and of grouped-query attention across key tiles (f32, and bf16 on tensor cores);
#   4. a profile of GPT-2 124M bf16 (the benchmark's executable, launches blocking so that each
#      instruction's time is its GPU time): where the step goes, per op kind.
#
# Writes bench/results/gpu_check_<date>.md: device, date, commit, each command, its exit status and
# the tail of its output. Needs only PTC (default build/tools/ptc, with ptc-runner beside it) and
# python3; a library the binaries lack on the GPU machine is named before anything runs.
# GPU_CHECK_STEPS (default 10) sets the benchmark's timed steps and GPU_CHECK_LIMIT (default 420)
# each step's seconds, to fit a short lease. GPU_CHECK_BASELINE=PTC also times that other ptc
# build (ptc-runner beside it), in 3 rounds interleaved with this one: a change side by side.
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ptc=${1:-$root/build/tools/ptc}
[ -x "$ptc" ] || { echo "gpu_check: no ptc at $ptc (build first, or pass its path)" >&2; exit 2; }
missing=$(ldd "$ptc" "$(dirname "$ptc")/ptc-runner" 2>/dev/null | grep 'not found' | sort -u)
if [ -n "$missing" ]; then
  echo "gpu_check: the binaries cannot start here; missing libraries:" >&2
  echo "$missing" >&2
  exit 2
fi
if [ ! -e /dev/nvidiactl ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  echo "gpu_check: skipped: this machine has no NVIDIA driver (nothing recorded)"
  exit 77
fi
stamp=$(date -u +%Y-%m-%d_%H%M%S)
out="$root/bench/results/gpu_check_$stamp.md"
mkdir -p "$root/bench/results"
device=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
         head -1)
# PTC_COMMIT: a copy of the tree without .git (a lent GPU machine gets one) names its commit
commit=${PTC_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
{
  echo "# gpu_check, $stamp UTC"
  echo
  echo "- device: ${device:-no GPU found by nvidia-smi}"
  echo "- commit: $commit"
  echo "- command: bench/gpu_check.sh $*"
} > "$out"
rc_all=0
step() { # step TITLE SECONDS CMD...
  local title=$1 limit=$2
  shift 2
  local log
  log=$(mktemp)
  local t0=$SECONDS
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] || rc_all=1
  {
    echo
    echo "## $title: exit $rc in $((SECONDS - t0)) s"
    echo
    echo "    $*"
    echo
    echo '```'
    tail -n 200 "$log"
    echo '```'
  } >> "$out"
  echo "$title: exit $rc ($((SECONDS - t0)) s)"
  rm -f "$log"
}
step "CUDA backend against the CPU (cuda_emulated.py --device cuda)" "${GPU_CHECK_LIMIT:-420}" \
  python3 "$root/tests/train/cuda_emulated.py" "$ptc" "$root" --device cuda
step "GPT-2 124M bf16 against PyTorch (cuda_train.py)" "${GPU_CHECK_LIMIT:-420}" \
  python3 "$root/bench/cuda_train.py" --ptc "$ptc" --steps "${GPU_CHECK_STEPS:-10}" --warmup 2 \
  ${GPU_CHECK_BASELINE:+--baseline "$GPU_CHECK_BASELINE" --rounds 3}
step "GPT-2 124M fp32, TF32 GEMMs on both sides (cuda_train.py --matmul-precision high)" \
  "${GPU_CHECK_LIMIT:-420}" python3 "$root/bench/cuda_train.py" --ptc "$ptc" --precision fp32 \
  --matmul-precision high --steps 5 --warmup 2
for tool in memcheck racecheck; do
  step "compute-sanitizer $tool (gpu_sanitize.sh)" "${GPU_CHECK_LIMIT:-420}" \
    bash "$root/bench/gpu_sanitize.sh" "$ptc" "$tool"
done
prof=$(mktemp -d)
step "GPT-2 124M bf16, time per op kind (--profile, CUDA_LAUNCH_BLOCKING=1)" 90 \
  bash -c "'$ptc' '$root/examples/gpt2.ptm' -o '$prof/g' --precision bf16 -D batch=16 \
    -D seq=1024 > /dev/null && CUDA_LAUNCH_BLOCKING=1 '$prof/g' --device cuda --steps 4 --profile"
rm -rf "$prof"
echo "recorded in $out"
exit $rc_all
