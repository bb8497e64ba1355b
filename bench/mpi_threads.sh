#!/usr/bin/env bash
# mpi_threads.sh [PTC] - one plan (gpt2_tiny at dp=2,tp=2, 100 steps of the corpus) run as 4 threads
# of one process, as 4 processes (mpirun -np 4) and as 2 processes x 2 threads
# (--ranks-per-process 2): the summary line of each, written to bench/results/mpi_threads_DATE.md.
# Timing never fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
ptc=${1:-build/tools/ptc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
build/tools/ptc-tokenize examples/data/corpus.txt -o "$work/train.bin" > /dev/null
"$ptc" --mesh dp=2,tp=2 examples/gpt2_tiny.ptm -o "$work/g" > /dev/null
run=("$work/g" --data "$work/train.bin" --steps 100 --quiet --threads 1)
out=bench/results/mpi_threads_$(date +%Y-%m-%d_%H%M%S).md
{
  echo "# one plan as threads and as processes, $(date +%Y-%m-%d)"
  echo
  echo "    bench/mpi_threads.sh $*"
  echo
  echo "- machine: \`$(uname -srm)\`, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), nproc $(nproc)"
  echo "- commit: $(git rev-parse --short HEAD); $(mpirun --version | head -1)"
  echo "- plan: examples/gpt2_tiny.ptm at --mesh dp=2,tp=2 (4 ranks), 100 steps, --threads 1 per rank"
  echo
  echo '```'
  echo "4 threads, 1 process:        $("${run[@]}" | tail -1)"
  echo "4 processes (mpirun -np 4):  $(mpirun -np 4 "${run[@]}" | tail -1)"
  echo "2 processes x 2 threads:     $(mpirun -np 2 "${run[@]}" --ranks-per-process 2 | tail -1)"
  echo '```'
} > "$out"
cat "$out"
