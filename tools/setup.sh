#!/usr/bin/env bash
# setup.sh - installs what ptc needs on Debian 12 (only what is missing), then configures and
# builds it in build/ (or $1). Used by both README commands and by CI.
#   tools/setup.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true

# graphviz: the README's `ptc --emit dot FILE | dot -Tsvg` (tests/robust/setup.sh runs it)
pkgs=(build-essential cmake ninja-build pkg-config flex bison libcriterion-dev
      libdnnl2 libopenblas0-pthread llvm-dev clang libclang-rt-dev
      python3-torch python3-numpy graphviz openmpi-bin libopenmpi-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j "$jobs"
