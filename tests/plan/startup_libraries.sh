#!/usr/bin/env bash
# startup_libraries.sh PTC SOURCE_DIR - LLVM is opened only where code is generated
# (codegen/llvm/llvm_api.h): neither ptc nor the executables it writes link it, ptc compiling a
# model never loads it, nor does a run on the cpu or ref backend; the jit backend's does, and
# trains; one that will not open is named. (Linked, it cost every process 22 ms at start, 45 ms
# under ASan.)
set -u
ptc=$1 src=$2
work=$(mktemp -d) || exit 2
trap 'rm -rf "$work"' EXIT
failed=0
say() { echo "$1 $2"; [ "$1" = ok ] || failed=1; }
loads_llvm() { LD_DEBUG=files "$@" 2>&1 >/dev/null | grep -q 'file=[^ ]*libLLVM'; }

readelf -d "$ptc" | grep -q 'NEEDED.*libLLVM' && say FAIL "ptc links libLLVM" || say ok "ptc does not link libLLVM"
loads_llvm "$ptc" "$src/examples/gpt2_tiny.ptm" --mesh dp=2 -o "$work/g" \
  && say FAIL "ptc compiling gpt2_tiny loaded libLLVM" || say ok "ptc compiles without loading libLLVM"
[ -x "$work/g" ] || { say FAIL "ptc -o wrote no executable"; exit 1; }
readelf -d "$work/g" | grep -q 'NEEDED.*libLLVM' && say FAIL "the executable links libLLVM" \
  || say ok "the executable does not link libLLVM"
for b in cpu ref; do
  loads_llvm "$work/g" --steps 1 --quiet --backend $b && say FAIL "--backend $b loaded libLLVM" \
    || say ok "--backend $b trains without loading libLLVM"
done
if loads_llvm "$work/g" --steps 1 --quiet --backend jit; then
  "$work/g" --steps 1 --quiet --backend jit >/dev/null 2>&1 && say ok "--backend jit opens libLLVM and trains" \
    || say FAIL "--backend jit opened libLLVM but did not train"
else
  say FAIL "--backend jit did not load libLLVM (its kernels cannot have been compiled)"
fi
# a library that will not open: the jit backend says which and what to do, before a step
PTC_LLVM_LIBRARY=$work/no-libLLVM.so "$work/g" --steps 1 --quiet --backend jit >/dev/null 2>"$work/err"
rc=$?
grep -q "the jit backend needs LLVM [0-9]*'s library ($work/no-libLLVM.so, from \$PTC_LLVM_LIBRARY), which would not open" "$work/err" \
  && [ $rc -eq 1 ] && say ok "a missing LLVM library is named (exit 1)" \
  || say FAIL "a missing LLVM library: exit $rc, $(head -c 300 "$work/err")"
exit $failed
