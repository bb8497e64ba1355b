#!/usr/bin/env bash
# demo_loss_falls.sh PTC PTC_TOKENIZE SOURCE_DIR - the demo path (tools/demo.sh, README): tokenize
# the shipped corpus with a 5% validation split, compile examples/gpt2_tiny.ptm, train at the demo
# settings (--lr 3e-3 --warmup 20, cosine, validation every 100 steps) and check from the JSON log
# that the model learns:
#   - every step 1..STEPS is logged once, with a finite loss;
#   - the mean loss of the last 10 steps is below 80% of the first step's loss and below
#     ln(256) = 5.545 (a uniform guess over the 256 byte values);
#   - val_loss lines exist (every 100 steps and at the last step), are finite, and the last is
#     below ln(256).
# DEMO_STEPS overrides the number of steps (default 150). Exit 0 on pass, 1 with a message.
set -u -o pipefail

ptc=${1:?usage: demo_loss_falls.sh PTC PTC_TOKENIZE SOURCE_DIR}
tokenize=${2:?usage: demo_loss_falls.sh PTC PTC_TOKENIZE SOURCE_DIR}
src=${3:?usage: demo_loss_falls.sh PTC PTC_TOKENIZE SOURCE_DIR}
abs() { case $1 in /*) echo "$1" ;; */*) echo "$PWD/$1" ;; *) command -v "$1" || echo "$1" ;; esac; }
ptc=$(abs "$ptc") tokenize=$(abs "$tokenize") src=$(cd "$src" && pwd) || exit 2
steps=${DEMO_STEPS:-150}

work=$(mktemp -d "${TMPDIR:-/tmp}/ptc-demo.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
cd "$work" || exit 1

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

t0=$EPOCHREALTIME
"$tokenize" "$src/examples/data/corpus.txt" -o train.bin --val-fraction 0.05 --val-output val.bin \
  > tok.out 2>&1 || { cat tok.out; fail "ptc-tokenize failed"; }
"$ptc" "$src/examples/gpt2_tiny.ptm" -o gpt2_tiny > compile.out 2>&1 ||
  { cat compile.out; fail "ptc could not compile examples/gpt2_tiny.ptm"; }
./gpt2_tiny --data train.bin --val-data val.bin --val-every 100 --steps "$steps" --lr 3e-3 \
  --warmup 20 --checkpoint-dir ckpt --checkpoint-every 100 --log train.jsonl > train.out 2>&1 ||
  { tail -n 20 train.out; fail "training exited $?"; }
t1=$EPOCHREALTIME
tail -n 4 train.out

# step loss, one line per logged training step
sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' train.jsonl > loss.txt
sed -n 's/^{"step": \([0-9]*\), "val_loss": \([^}]*\)}$/\1 \2/p' train.jsonl > val.txt

awk -v steps="$steps" -v t0="$t0" -v t1="$t1" -v ln256=5.545177444 '
  function finite(x) { return x ~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/ }
  FILENAME ~ /loss.txt$/ {
    n++
    if ($1 != n) { printf "FAIL: line %d of the log is step %s, expected %d\n", n, $1, n; bad = 1; exit }
    if (!finite($2)) { printf "FAIL: step %d: loss %s is not finite\n", n, $2; bad = 1; exit }
    loss[n] = $2 + 0
    next
  }
  { nval++; if (!finite($2)) { printf "FAIL: step %s: val_loss %s is not finite\n", $1, $2; bad = 1; exit }
    val[nval] = $0; lastval = $2 + 0 }
  END {
    if (bad) exit 1
    if (n != steps) { printf "FAIL: %d training steps logged, expected %d\n", n, steps; exit 1 }
    if (n < 20) { printf "FAIL: too few steps (%d) for the check\n", n; exit 1 }
    for (i = n - 9; i <= n; i++) last += loss[i]
    last /= 10
    printf "first loss %.6f, mean of the last 10 steps %.6f (%.1f%% of the first; limit 80%%), ln(256) = %.4f\n",
      loss[1], last, 100 * last / loss[1], ln256
    for (i = 1; i <= nval; i++) printf "val: step %s\n", val[i]
    printf "tokenize + compile + %d steps: %.1f s\n", steps, t1 - t0
    if (!(last < 0.8 * loss[1])) { print "FAIL: the loss did not fall below 80% of the first step'"'"'s"; exit 1 }
    if (!(last < ln256)) { print "FAIL: the final loss is not below ln(256)"; exit 1 }
    if (nval < 1) { print "FAIL: no val_loss line in the log"; exit 1 }
    want = int(steps / 100) + (steps % 100 != 0)
    if (!(lastval < ln256)) { printf "FAIL: the last val_loss %g is not below ln(256)\n", lastval; exit 1 }
    if (nval != want) { printf "FAIL: %d val_loss lines, expected %d (every 100 steps and the last)\n", nval, want; exit 1 }
  }' loss.txt val.txt || exit 1
[ -f ckpt/latest ] || fail "no checkpoint written"
echo "PASS demo_loss_falls"
exit 0
