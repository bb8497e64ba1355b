#!/usr/bin/env bash
# demo.sh - the main job: set up, build, tokenize the shipped corpus, compile the demo model and
# train it on the CPU. The loss printed per step falls as the model learns the text.
#   tools/demo.sh [STEPS]    (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
tools/setup.sh build
mkdir -p build/demo
build/tools/ptc-tokenize examples/data/corpus.txt -o build/demo/train.bin \
  --val-fraction 0.05 --val-output build/demo/val.bin
build/tools/ptc examples/gpt2_tiny.ptm -o build/demo/gpt2_tiny
build/demo/gpt2_tiny --data build/demo/train.bin --val-data build/demo/val.bin \
  --val-every 100 --steps "$steps" --lr 3e-3 --warmup 20 \
  --checkpoint-dir build/demo/ckpt --checkpoint-every 100 --log build/demo/train.jsonl
