#!/usr/bin/env bash
# resume_sigkill.sh PTC PTC_TOKENIZE SOURCE_DIR - a training run killed with SIGKILL and resumed
# must be bit-identical to one that was never interrupted.
#
#  1. reference: gpt2_tiny, N steps, --shuffle --seed 7, a checkpoint every step (dir A);
#  2. the same command in dir B, killed with SIGKILL once its log shows step >= K, then run again
#     with --resume to step N. The last occurrence of every step in B's log (the log is appended
#     on resume, and the killed run may have logged steps past its last checkpoint) must print
#     the same loss, lr and grad_norm (%.9g) as A's, and the final checkpoints must be identical
#     byte for byte (tensors and metadata: step, data position, seed, config hash, checksum);
#  3. dir C: several rounds of start-with-`--resume` then SIGKILL, some aimed at the moment a
#     checkpoint (or DIR/latest) is being written, some at random moments; after every kill
#     DIR/latest must name a complete file that the next --resume accepts (checksum verified),
#     the resumed step must never go backwards, and the run finished at the end must again be
#     bit-identical to A.
# The training data are a small slice of the corpus, so the N steps cross several shuffled
# epochs and the resume lands in the middle of one (the data position matters).
#
# Environment: RESUME_STEPS (N, default 40), RESUME_KILL_AT (K, default 13), RESUME_ROUNDS (rounds
# of part 3, default 8), RESUME_SEED (bash RANDOM seed for the kill moments; printed), RESUME_ARGS
# (more flags for every run, e.g. "--backend ref").
# Exit 0 when everything matches; 1 with a message naming the first difference otherwise.
set -u -o pipefail

ptc=${1:?usage: resume_sigkill.sh PTC PTC_TOKENIZE SOURCE_DIR}
tokenize=${2:?usage: resume_sigkill.sh PTC PTC_TOKENIZE SOURCE_DIR}
src=${3:?usage: resume_sigkill.sh PTC PTC_TOKENIZE SOURCE_DIR}
# the script works in a temporary directory: make relative paths absolute
abs() { case $1 in /*) echo "$1" ;; */*) echo "$PWD/$1" ;; *) command -v "$1" || echo "$1" ;; esac; }
ptc=$(abs "$ptc") tokenize=$(abs "$tokenize") src=$(cd "$src" && pwd) || exit 2
N=${RESUME_STEPS:-40}
K=${RESUME_KILL_AT:-13}
ROUNDS=${RESUME_ROUNDS:-8}
seed=${RESUME_SEED:-$$}
RANDOM=$seed
POLL_TIMEOUT=120 # seconds to wait for a run to reach a point before giving up

work=$(mktemp -d "${TMPDIR:-/tmp}/ptc-resume.XXXXXX") || exit 1
bg_pid=
cleanup() {
  if [ -n "$bg_pid" ] && kill -0 "$bg_pid" 2>/dev/null; then
    kill -9 "$bg_pid" 2>/dev/null
    wait "$bg_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

cd "$work" || exit 1
exe=$work/gpt2_tiny
"$ptc" "$src/examples/gpt2_tiny.ptm" -o "$exe" > compile.out 2>&1 ||
  { cat compile.out; fail "ptc could not compile examples/gpt2_tiny.ptm"; }
# 3000 bytes: 46 windows of 65 tokens, 11 batches of 4 per epoch, so 40 steps are ~3.6 epochs.
head -c 3000 "$src/examples/data/corpus.txt" > slice.txt
"$tokenize" slice.txt -o train.bin > tokenize.out 2>&1 ||
  { cat tokenize.out; fail "ptc-tokenize failed"; }

# common DIR LOG: the training command shared by every run.
common() {
  printf '%s\n' "$exe" --data "$work/train.bin" --steps "$N" --checkpoint-dir "$1" \
    --checkpoint-every 1 --log "$2" --shuffle --seed 7
  # shellcheck disable=SC2086 # RESUME_ARGS is a list of flags
  [ -z "${RESUME_ARGS:-}" ] || printf '%s\n' $RESUME_ARGS
}
mapfile -t cmd_a < <(common "$work/A" "$work/a.jsonl")
mapfile -t cmd_b < <(common "$work/B" "$work/b.jsonl")
mapfile -t cmd_c < <(common "$work/C" "$work/c.jsonl")

# steps LOG: "step loss lr grad_norm" per training line, as printed; for every step the LAST line
# that logged it; sorted by step.
steps() {
  sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\), "lr": \([^,]*\), "grad_norm": \([^,]*\),.*/\1 \2 \3 \4/p' "$1" |
    awk '{last[$1] = $0} END {for (s in last) print last[s]}' | sort -n
}

# last_step LOG: the highest step logged so far (0 if none).
last_step() {
  local s
  s=$(sed -n 's/^{"step": \([0-9]*\), "loss".*/\1/p' "$1" 2>/dev/null | tail -n 1)
  echo "${s:-0}"
}

# compare_logs LOG WHAT: every step 1..N present once (last occurrence) with A's exact numbers.
compare_logs() {
  steps "$work/a.jsonl" > ref.steps
  steps "$1" > got.steps
  local nref ngot
  nref=$(wc -l < ref.steps)
  ngot=$(wc -l < got.steps)
  [ "$nref" -eq "$N" ] || fail "reference log has $nref distinct steps, expected $N"
  [ "$ngot" -eq "$N" ] || fail "$2: log has $ngot distinct steps, expected $N"
  if ! cmp -s ref.steps got.steps; then
    paste -d ' ' ref.steps got.steps | awk '$1 != $5 || $2 != $6 || $3 != $7 || $4 != $8 {
      if (++n == 1) print "first differences (loss, lr, grad_norm: reference -> resumed):"
      if (n <= 8) printf "  step %s: loss %s -> %s, lr %s -> %s, grad_norm %s -> %s\n", $1, $2, $6, $3, $7, $4, $8
      if (n == 1) first = $1 } END { print first > "first.step" }' >&2
    fail "$2: logged numbers differ from the uninterrupted run from step $(cat first.step) on"
  fi
  echo "  log: steps 1..$N, loss/lr/grad_norm identical as printed (%.9g); e.g. step $N: $(tail -n 1 got.steps)"
}

# header_len FILE: the safetensors header length (first 8 bytes, little-endian).
header_len() {
  od -An -t u8 -N 8 "$1" | tr -d ' '
}

# compare_ckpt DIR WHAT: DIR's final checkpoint and latest equal A's byte for byte.
compare_ckpt() {
  local f
  f=$(printf 'step_%08d.safetensors' "$N")
  [ -f "$work/A/$f" ] || fail "reference run left no $f"
  [ -f "$1/$f" ] || fail "$2: no final checkpoint $f"
  cmp -s "$work/A/latest" "$1/latest" ||
    fail "$2: latest names '$(cat "$1/latest")', reference '$(cat "$work/A/latest")'"
  if ! cmp -s "$work/A/$f" "$1/$f"; then
    local ha hb
    ha=$(header_len "$work/A/$f")
    hb=$(header_len "$1/$f")
    if [ "$ha" = "$hb" ] &&
      cmp -s <(head -c $((8 + ha)) "$work/A/$f") <(head -c $((8 + hb)) "$1/$f"); then
      fail "$2: $f: headers equal, tensor data differ ($(cmp "$work/A/$f" "$1/$f" 2>&1 | head -n 1))"
    fi
    cmp -s <(tail -c +$((9 + ha)) "$work/A/$f") <(tail -c +$((9 + hb)) "$1/$f") &&
      fail "$2: $f: tensor data equal, headers (metadata) differ: $(head -c $((8 + hb)) "$1/$f" | tail -c +9 | grep -o '"__metadata__":{[^}]*}')"
    fail "$2: $f differs from the reference in tensor data and header"
  fi
  echo "  checkpoint: $f identical to the reference ($(wc -c < "$1/$f") bytes: header with step," \
    "data position, seed, config hash, checksum, and all $(head -c $((8 + $(header_len "$1/$f"))) "$1/$f" | grep -a -o '"data_offsets"' | wc -l) tensors); latest equal"
}

# wait_for COND_FUNCTION PID WHAT [busy]: polls until COND succeeds (every 5 ms, or without pause
# with "busy", to catch a write of a few milliseconds); returns 1 if PID exits first; fails on
# timeout.
wait_for() {
  local deadline=$((SECONDS + POLL_TIMEOUT))
  while ! "$1"; do
    kill -0 "$2" 2>/dev/null || return 1
    [ $SECONDS -lt $deadline ] || fail "timed out after ${POLL_TIMEOUT}s waiting for $3"
    [ "${4:-}" = busy ] || sleep 0.005
  done
  return 0
}

echo "resume_sigkill: N=$N steps, kill at step >= $K, $ROUNDS kill rounds, RESUME_SEED=$seed${RESUME_ARGS:+, RESUME_ARGS=$RESUME_ARGS}"
t0=$SECONDS

# ---- 1. reference ----
ta=$EPOCHREALTIME
"${cmd_a[@]}" > a.out 2>&1 || { tail -n 20 a.out; fail "reference run exited $?"; }
# the whole run in ms: the random kill moments of part 3 fall within its first sixth
run_ms=$(awk -v a="$ta" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }')
echo "reference: $N steps in $run_ms ms, checkpoints in A ($(cat A/latest))"

# ---- 2. one SIGKILL at step >= K, then --resume ----
"${cmd_b[@]}" > b1.out 2>&1 &
bg_pid=$!
reached_k() { [ "$(last_step "$work/b.jsonl")" -ge "$K" ]; }
wait_for reached_k "$bg_pid" "run B to log step $K" ||
  fail "run B exited before logging step $K (too fast or failed): $(tail -n 3 b1.out)"
{ kill -9 "$bg_pid"; wait "$bg_pid"; } 2>/dev/null # (no "Killed" notice from bash)
rc=$?
bg_pid=
[ $rc -eq 137 ] || fail "run B exited $rc before the SIGKILL reached it (expected 137)"
logged=$(last_step b.jsonl)
[ -f B/latest ] || fail "killed run left no B/latest"
ckpt=$(cat B/latest)
echo "killed run B with SIGKILL: logged up to step $logged, B/latest = $ckpt"
[ "$logged" -lt "$N" ] || fail "run B finished all $N steps before the kill; raise RESUME_STEPS"
"${cmd_b[@]}" --resume > b2.out 2>&1 || { tail -n 20 b2.out; fail "resume of B exited $?"; }
resumed=$(sed -n 's/^resumed from .* (step \([0-9]*\))$/\1/p' b2.out)
[ -n "$resumed" ] || { head -n 3 b2.out; fail "resume of B did not say 'resumed from ... (step K)'"; }
if [ "$resumed" -lt 1 ] || [ "$resumed" -ge "$N" ]; then fail "B resumed from step $resumed"; fi
[ "$(printf 'step_%08d.safetensors' "$resumed")" = "$ckpt" ] ||
  fail "B resumed from step $resumed, but B/latest named $ckpt"
if [ "$logged" -gt "$resumed" ]; then
  echo "resumed B from step $resumed to $N; the killed run's steps $((resumed + 1))..$logged are logged twice"
else
  echo "resumed B from step $resumed to $N"
fi
compare_logs b.jsonl "killed+resumed run B"
compare_ckpt "$work/B" "killed+resumed run B"

# ---- 3. kills aimed at checkpoint writes ----
# resume_point DIR: the step a --resume in DIR must continue from, as checkpoint.h specifies: the
# one DIR/latest names, else the highest step file, else 0. Fails if latest names a missing file.
resume_point() {
  local name
  if [ -e "$1/latest" ]; then
    name=$(cat "$1/latest")
    [ -f "$1/$name" ] || fail "$1/latest names '$name', which does not exist"
  else
    name=$(find "$1" -maxdepth 1 -name 'step_*.safetensors' -printf '%f\n' 2>/dev/null | sort | tail -n 1)
  fi
  [ -n "$name" ] || { echo 0; return; }
  name=$(echo "$name" | sed -n 's/^step_0*\([0-9][0-9]*\)\.safetensors$/\1/p')
  [ -n "$name" ] || fail "$1/latest holds '$(cat "$1/latest")', not a checkpoint name"
  echo "$name"
}
kills=0 mid_write=0 lagging=0 done_early=0 prev=0
for ((r = 1; r <= ROUNDS; r++)); do
  # stdout goes to a file (fully buffered, lost on SIGKILL), so what a run resumed from is read
  # from the log, which is flushed every step: its first new line is the resumed step + 1. The
  # log is appended when there is a checkpoint to resume from, else started afresh.
  if [ "$prev" -gt 0 ]; then before=$(wc -l < c.jsonl); else before=0; fi
  touch round.mark
  "${cmd_c[@]}" --resume > "c$r.out" 2>&1 &
  bg_pid=$!
  # target: a checkpoint 1..4 steps past where this run starts (never the final one)
  target=$((prev + 1 + RANDOM % 4))
  # past any step file a lagging latest left behind (it exists already: no moment to catch)
  newest=$(find C -maxdepth 1 -name 'step_*.safetensors' -printf '%f\n' 2>/dev/null | sort | tail -n 1 |
    sed -n 's/^step_0*\([0-9][0-9]*\)\.safetensors$/\1/p')
  [ -z "$newest" ] || [ "$target" -gt "$newest" ] || target=$((newest + 1))
  [ $target -lt "$N" ] || target=$((N - 1))
  tgt_file=$(printf '%s/C/step_%08d.safetensors' "$work" "$target")
  name=
  poll=busy
  case $((RANDOM % 3)) in
  0) # while a step file is being written: PATH.tmp.PID exists. If the poll misses the window of
     # the target, it moves on to the next checkpoint.
    how="while writing a checkpoint (from step $target on)"
    cond() {
      [ -e "$tgt_file.tmp.$bg_pid" ] && return 0
      if [ -e "$tgt_file" ] && [ "$target" -lt $((N - 1)) ]; then
        target=$((target + 1))
        tgt_file=$(printf '%s/C/step_%08d.safetensors' "$work" "$target")
      fi
      return 1
    } ;;
  1) # the moment the target step file is renamed into place: before or while DIR/latest is
     # replaced (or just after)
    how="as step_$(printf %08d $target).safetensors appeared"
    cond() { [ -e "$tgt_file" ]; } ;;
  *) # at a random moment
    delay=$(awk -v ms=$((10 + RANDOM % (run_ms / 6 + 1))) 'BEGIN { printf "%.3f", ms / 1000 }')
    how="at a random moment (${delay}s after the start)"
    poll=
    cond() { sleep "$delay"; } ;;
  esac
  {
    if wait_for cond "$bg_pid" "round $r: kill $how" $poll; then
      kill -9 "$bg_pid"
    fi
    wait "$bg_pid"
  } 2>/dev/null
  rc=$?
  pid=$bg_pid
  bg_pid=
  if [ $rc -ne 137 ]; then
    # it got past the target before the poll saw it, and finished
    [ $rc -eq 0 ] || { tail -n 20 "c$r.out"; fail "round $r: run exited $rc"; }
    done_early=$((done_early + 1))
    echo "round $r: the run finished before the kill ($how)"
    break
  fi
  kills=$((kills + 1))
  first=$(tail -n +$((before + 1)) c.jsonl | sed -n 's/^{"step": \([0-9]*\), "loss".*/\1/p' | head -n 1)
  if [ -n "$first" ]; then
    [ "$first" -eq $((prev + 1)) ] ||
      fail "round $r: the run went on from step $((first - 1)), but it should have resumed from step $prev"
    if [ "$prev" -eq 0 ]; then got="started afresh"; else got="resumed at step $prev"; fi
    got="$got, logged steps $first..$(last_step c.jsonl)"
  else
    got="killed before its first step (resuming from step $prev)"
  fi
  grep -q 'error' "c$r.out" && { cat "c$r.out"; fail "round $r: error in the run"; }
  left=$(find C -name "*.tmp.$pid" -printf '%f ' 2>/dev/null)
  newest=$(find C -name 'step_*.safetensors' -printf '%f\n' | sort | tail -n 1)
  if [ -n "$left" ]; then
    mid_write=$((mid_write + 1)); note="killed mid-write, left $left"
  elif [ -n "$newest" ] && [ "$newest" != "$(cat C/latest 2>/dev/null)" ] &&
    [ -n "$(find "C/$newest" -newer round.mark)" ]; then
    mid_write=$((mid_write + 1)); lagging=$((lagging + 1))
    note="killed between the rename of $newest and the update of latest"
  else
    note="no write in progress"
  fi
  now=$(resume_point C) || exit 1
  [ "$now" -ge "$prev" ] || fail "round $r: the checkpoint to resume from went back from step $prev to $now"
  prev=$now
  if [ -e C/latest ]; then name=$(cat C/latest); else name="none (resume would take step $now)"; fi
  echo "round $r: $got; killed $how: $note; latest = ${name:-none}"
done
"${cmd_c[@]}" --resume > c_final.out 2>&1 || { tail -n 20 c_final.out; fail "final resume of C exited $?"; }
got=$(sed -n 's/^resumed from .* (step \([0-9]*\))$/\1/p' c_final.out)
if [ "$prev" -gt 0 ] && [ "$done_early" -eq 0 ]; then
  [ "$got" = "$prev" ] || fail "final resume of C started from step '${got:-none}', expected $prev"
fi
for f in C/step_*.safetensors; do # every checkpoint file left must be complete and load
  [ -e "$f" ] || continue
  "$exe" --init-from "$f" --steps 1 --quiet > init.out 2>&1 ||
    { cat init.out; fail "checkpoint $f left in C does not load"; }
done
echo "part 3: $kills kills ($mid_write inside a checkpoint save: $((mid_write - lagging)) left a temporary file," \
  "$lagging left latest behind a newer complete step file);" \
  "every run went on from the checkpoint latest named (or the newest step file where latest was missing); final resume from step ${got:-?} to $N"
stale=$(find C -name '*.tmp.*' | wc -l)
[ "$stale" -eq 0 ] || echo "  note: $stale stale temporary file(s) from killed writers remain in C: $(find C -name '*.tmp.*' -printf '%f ' | head -c 300)"
[ "$mid_write" -gt 0 ] || echo "  note: no kill landed inside a write this time (timing); resume still worked"
compare_logs c.jsonl "run C (killed $kills times)"
compare_ckpt "$work/C" "run C (killed $kills times)"
echo "PASS resume_sigkill ($((SECONDS - t0)) s)"
exit 0
