#!/usr/bin/env bash
# run.sh PTC GOLDEN_DIR [--regen] - golden-file tests.
#   GOLDEN_DIR/ir/X.ptm      ->  `ptc --emit ir X.ptm` must print X.ir (exit 0)
#   GOLDEN_DIR/errors/X.ptm  ->  `ptc --emit ir X.ptm` must print X.err on stderr and exit 1
#   GOLDEN_DIR/program/X.args -> `ptc --emit program ARGS` must print X.program (exit 0); ARGS is
#                                the file's one line, model paths relative to GOLDEN_DIR
#   GOLDEN_DIR/kernels/X.args -> `ptc --emit kernels ARGS` must print X.kir, the generated
#                                kernels, and `ptc --emit cuda ARGS` X.cu, their CUDA C
# A first line "# ptc-args: ..." in a .ptm adds arguments. --regen rewrites the expected files.
# Paths in output are relative to GOLDEN_DIR so the files do not depend on where the tree is.
set -u
ptc=$1 dir=$2 regen=${3:-}
cd "$dir" || exit 2
fail=0 pass=0
for kind in ir errors; do
  for src in "$kind"/*.ptm; do
    [ -e "$src" ] || continue
    args=$(sed -n '1s/^# ptc-args: //p' "$src")
    if [ "$kind" = ir ]; then exp=${src%.ptm}.ir; else exp=${src%.ptm}.err; fi
    # shellcheck disable=SC2086
    if [ "$kind" = ir ]; then
      out=$("$ptc" --emit ir $args "$src" 2>&1); rc=$?; want=0
    else
      out=$("$ptc" --emit ir $args "$src" 2>&1 >/dev/null); rc=$?; want=1
    fi
    if [ "$regen" = --regen ]; then
      printf '%s\n' "$out" > "$exp"
      [ $rc -eq $want ] || echo "warning: $src exited $rc (expected $want)"
      continue
    fi
    if [ $rc -ne $want ]; then
      echo "FAIL $src: exit status $rc, expected $want"; printf '%s\n' "$out" | head -20
      fail=$((fail+1)); continue
    fi
    if ! diff -u "$exp" <(printf '%s\n' "$out") > /tmp/ptc-golden-diff.$$; then
      echo "FAIL $src: output differs from $exp"; head -40 /tmp/ptc-golden-diff.$$
      fail=$((fail+1))
    else
      pass=$((pass+1))
    fi
  done
done
# golden KIND ARGS_FILE EXPECTED: `ptc --emit KIND ARGS` against EXPECTED
golden() {
  local kind=$1 src=$2 exp=$3 out rc
  # shellcheck disable=SC2046
  out=$("$ptc" --emit "$kind" $(cat "$src") 2>&1); rc=$?
  if [ "$regen" = --regen ]; then
    printf '%s\n' "$out" > "$exp"
    [ $rc -eq 0 ] || echo "warning: $src exited $rc"
    return
  fi
  if [ $rc -ne 0 ]; then
    echo "FAIL $src (--emit $kind): exit status $rc"; printf '%s\n' "$out" | head -20
    fail=$((fail+1)); return
  fi
  if ! diff -u "$exp" <(printf '%s\n' "$out") > /tmp/ptc-golden-diff.$$; then
    echo "FAIL $src: output differs from $exp"; head -40 /tmp/ptc-golden-diff.$$
    fail=$((fail+1))
  else
    pass=$((pass+1))
  fi
}
for src in program/*.args; do
  [ -e "$src" ] && golden program "$src" "${src%.args}.program"
done
for src in kernels/*.args; do
  [ -e "$src" ] || continue
  golden kernels "$src" "${src%.args}.kir"
  golden cuda "$src" "${src%.args}.cu"
done
rm -f /tmp/ptc-golden-diff.$$
[ "$regen" = --regen ] && { echo "golden files rewritten; review with git diff"; exit 0; }
echo "golden: $pass passed, $fail failed"
[ $fail -eq 0 ]
