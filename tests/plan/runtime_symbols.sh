#!/usr/bin/env bash
# runtime_symbols.sh RUNTIME_LIB RUNNER COMPILER_LIB... - the runtime carries no compiler.
# Every global symbol defined by a compiler library (the front end, the passes, the plan's
# lowering and memory planner) must be neither referenced by the runtime library nor present in
# the runner that every executable is built from. Exit 0 when clean; 1 naming the symbols.
set -u
runtime=$1 runner=$2
shift 2
compiler=$(for lib in "$@"; do nm -g --defined-only "$lib" 2>/dev/null; done |
           awk 'NF >= 3 && $2 ~ /^[TDRB]$/ {print $3}' | sort -u)
[ -n "$compiler" ] || { echo "no symbols read from $*"; exit 2; }
used=$(nm "$runtime" | awk '{print $NF}' | sort -u)
linked=$(nm "$runner" | awk '{print $NF}' | sort -u)
bad_lib=$(comm -12 <(echo "$compiler") <(echo "$used"))
bad_exe=$(comm -12 <(echo "$compiler") <(echo "$linked"))
if [ -n "$bad_lib$bad_exe" ]; then
  [ -n "$bad_lib" ] && echo "the runtime library uses compiler symbols:" && echo "$bad_lib" | head -20
  [ -n "$bad_exe" ] && echo "the runner contains compiler symbols:" && echo "$bad_exe" | head -20
  exit 1
fi
echo "runtime: $(echo "$compiler" | wc -l) compiler symbols checked; none in $(basename "$runtime") or $(basename "$runner")"
