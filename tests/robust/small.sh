#!/usr/bin/env bash
# small.sh PTC PTC_TOKENIZE SOURCE_DIR - the smaller faults of issue 9, item 11, each refused with
# what to change: a --place that names a dimension the parameter lacks (it was an internal
# error) or matches nothing (it was ignored), a model without parameters given to training, --lr 0
# (the language says lr > 0), a batch that dp does not divide (name the const), a mesh axis over
# its limit (say the limit), an unknown op written as another framework writes it (did you mean);
# --quiet keeping the run's summary and "resumed from", the val loss line naming its step; and
# (item 5) a plan past the machine's memory refused with what it needs; (item 1) a non-finite
# gradient norm stopping the run before the update; (item 12) --eval; (item 13) model FLOPs and
# MFU; (item 11) one run at a time in a checkpoint directory.
source "$(dirname "$0")/lib.sh"
m=$src/examples/gpt2_tiny.ptm
check "--place wte=tp:S5" 2 "--place 'wte=tp:S5': parameter 'wte' f32\[256,64\] has 2 dimensions \(S0 to S1\)" "$ptc" --mesh tp=2 --place wte=tp:S5 "$m"
check "--place matching no parameter" 2 "--place 'wtf=tp:R': no parameter matches 'wtf'; did you mean 'wte'\?" "$ptc" --mesh tp=2 --place wtf=tp:R "$m"
check "--place glob matching no parameter" 2 "--place 'h\.\*\.mlp\.w_gate=tp:R': no parameter matches" "$ptc" --mesh tp=2 --place 'h.*.mlp.w_gate=tp:R' "$m"
check "--place on an axis the mesh lacks" 2 "--place 'wte=dp:R': the mesh has no axis dp" "$ptc" --mesh tp=2 --place wte=dp:R "$m"
check "--place without --mesh" 2 "--place needs --mesh" "$ptc" --place wte=tp:R "$m"
check "--place that matches (fine)" 0 "" "$ptc" --mesh tp=2 --place 'h.*.mlp.w_fc=tp:R' --emit plan "$m"
grep -Eq "h\.0\.mlp\.w_fc .*R" out.txt && ok "--place: the pin is in the plan" "" || bad "--place: the pin is in the plan" "$(grep 'h.0.mlp.w_fc' out.txt | head -2)"

cat > noparams.ptm << 'EOF2'
model m(x: f32[4, 8], y: f32[4, 8]) {
    return mse(x, y)
}
EOF2
check "a model without parameters, -o" 1 "^noparams\.ptm:1:7: error: model m has no parameters, so there is nothing to train" "$ptc" noparams.ptm -o np
[ -e np ] && bad "no executable for a model without parameters" "np was written" || ok "no executable for a model without parameters" ""
check "a model without parameters, --train" 1 "noparams\.ptm:1:7: error: model m has no parameters" "$ptc" --train noparams.ptm
check "a model without parameters, only checked (fine)" 0 "" "$ptc" noparams.ptm

"$ptc" "$m" -o exe > /dev/null 2>&1 || bad "setup" "cannot compile $m"
# --quiet leaves out the step lines, not the run's summary nor the checkpoint it resumed from;
# the val loss line names its step
check "--quiet (fine)" 0 "" ./exe --quiet --steps 2 --checkpoint-dir ck
grep -Eq "^done: 2 steps in" out.txt && ! grep -q "^step" out.txt && ok "--quiet prints the summary alone" "" ||
  bad "--quiet prints the summary alone" "$(head -c 300 out.txt)"
check "--quiet --resume (fine)" 0 "" ./exe --quiet --steps 3 --checkpoint-dir ck --resume
grep -q "^resumed from .*step_00000002.safetensors (step 2)" out.txt && ok "--quiet --resume says where it resumed" "" ||
  bad "--quiet --resume says where it resumed" "$(head -c 300 out.txt)"
check "--resume with a larger --steps (fine)" 0 "" ./exe --quiet --steps 6 --checkpoint-dir ck --resume
grep -Eq "^note: the checkpoint's run was to train 3 steps, this one 6: the cosine schedule stretches to the new end \(the learning rate of step 4 is [0-9.e+-]+, [0-9.e+-]+ in the run that wrote it\)" out.txt &&
  ok "--resume with another --steps says the schedule stretches" "" ||
  bad "--resume with another --steps says the schedule stretches" "$(head -c 400 out.txt)"
rm -rf ck
check "--quiet --steps 3 again (fine)" 0 "" ./exe --quiet --steps 3 --checkpoint-dir ck
check "--resume at the last step (fine)" 0 "" ./exe --quiet --steps 3 --checkpoint-dir ck --resume
grep -q "^nothing to train: the checkpoint is at step 3 and --steps is 3" out.txt &&
  ok "--resume at --steps says there is nothing to train" "" ||
  bad "--resume at --steps says there is nothing to train" "$(head -c 300 out.txt)"
head -c 20000 "$src/examples/data/corpus.txt" > val.txt
"$tokenize" val.txt -o val.bin > /dev/null 2>&1 || bad "setup" "cannot tokenize"
check "--val-every (fine)" 0 "" ./exe --steps 2 --data val.bin --val-data val.bin --val-every 2
grep -Eq "^step +2/2 \| val loss [0-9.]+$" out.txt && ok "the val loss line names its step" "" ||
  bad "the val loss line names its step" "$(grep val out.txt | head -2)"

# a plan larger than the machine: refused at start with what could not be had and what the plan
# needs, exit 1 (it aborted with status 134); activations of about 500 GB, past any overcommit
"$ptc" -D d=4096 -D heads=32 -D layers=4 -D batch=512 "$src/examples/gpt2.ptm" -o huge > /dev/null 2>&1 ||
  bad "setup" "cannot compile the huge gpt2"
check "a plan past the machine's memory" 1 "rank 0: out of memory: cannot allocate the [a-z]+ arena of [0-9]+ bytes .* \(the plan needs [0-9]+ bytes .* for this rank in all; see ptc --emit memory\)" ./huge --steps 1
rm -f huge

# (item 1) a gradient that is not finite with a finite loss (sqrt's gradient at 0): the run stops
# before the update, at 1 rank and at dp=2 ZeRO-3, and writes no checkpoint and no --save
cat > nan.ptm << 'EOF2'
model m(x: f32[4, 8]) {
    param w : [8, 8] init zeros
    return mean(mean(sqrt(x @ w), axis=-1), axis=-1)
}
EOF2
for mesh in "" "--mesh dp=2 --zero 3"; do
  # shellcheck disable=SC2086
  "$ptc" $mesh nan.ptm -o nan_exe > /dev/null 2>&1 || bad "setup" "cannot compile nan.ptm $mesh"
  rm -rf nan_ck nan.st
  check "a non-finite gradient norm ${mesh:-(1 rank)}" 1 "training diverged at step 1: the gradient norm is not finite \(nan\), the loss 0: stopped before the update" ./nan_exe --steps 2 --checkpoint-dir nan_ck --checkpoint-every 1 --save nan.st
  [ ! -e nan.st ] && [ ! -e nan_ck/step_00000001.safetensors ] && ok "no file of the non-finite step ${mesh:-(1 rank)}" "" ||
    bad "no file of the non-finite step ${mesh:-(1 rank)}" "$(ls nan_ck nan.st 2>&1)"
done

# (item 12) --eval: the validation loss of the weights it is given, the same as the training run
# printed for them; nothing written
"$tokenize" val.txt -o ev.bin > /dev/null 2>&1
rm -rf evck
check "train 3 steps with a val loss at the end (fine)" 0 "" ./exe --steps 3 --data ev.bin --val-data ev.bin --val-every 3 --checkpoint-dir evck
want=$(sed -n 's/^step *3\/3 | val loss \([0-9.]*\)$/\1/p' out.txt)
before=$(ls -l --time-style=full-iso evck)
check "--eval --resume" 0 "" ./exe --eval --val-data ev.bin --resume --checkpoint-dir evck
grep -q "^val loss $want (4 batches of 4 x 64 tokens, the weights of step 3)$" out.txt && [ -n "$want" ] &&
  ok "--eval --resume gives the val loss the run printed ($want)" "" ||
  bad "--eval --resume gives the val loss the run printed ($want)" "$(head -c 300 out.txt)"
[ "$(ls -l --time-style=full-iso evck)" = "$before" ] && ok "--eval leaves the checkpoints as they were" "" ||
  bad "--eval leaves the checkpoints as they were" "$(ls -l evck)"
check "--eval --init-from" 0 "" ./exe --eval --val-data ev.bin --init-from evck/step_00000003.safetensors
grep -q "^val loss $want " out.txt && ok "--eval --init-from: the same val loss" "" || bad "--eval --init-from: the same val loss" "$(head -c 300 out.txt)"
check "--eval without --val-data" 2 "--eval needs --val-data" ./exe --eval
check "--eval with --save" 2 "--eval writes nothing: leave out --save" ./exe --eval --val-data ev.bin --save x.st
check "--eval with a --checkpoint-dir to write" 2 "--eval writes nothing: --checkpoint-dir only with --resume" ./exe --eval --val-data ev.bin --checkpoint-dir evck2

# (item 13) model FLOPs and MFU. gpt2_tiny (d=64, 2 layers, 4 heads, vocab 256, batch 4 x 64):
# matrix products of 2 (64x192 + 64x64 + 64x256 + 256x64) + 64x256 = 114,688 weights, 6 flops a
# weight a token over 256 tokens: 176,160,768; attention 3 x 4 b s^2 d = 12,582,912 a layer, two
# layers: 25,165,824; PaLM's count 201,326,592
check "--emit program (fine)" 0 "" "$ptc" --emit program "$m"
grep -q "^model_flops 201326592$" out.txt && ok "the plan's model FLOPs are PaLM's count" "" ||
  bad "the plan's model FLOPs are PaLM's count" "$(grep model_flops out.txt)"
check "--peak-flops 1e11 (fine)" 0 "" ./exe --steps 2 --peak-flops 1e11 --log mfu.jsonl
grep -Eq "^step +2/2 \| .* tok/s \| MFU [0-9.]+% \|" out.txt && grep -Eq "MFU [0-9.]+% of 100 GFLOP/s \(--peak-flops\)$" out.txt &&
  ok "MFU in the step line and the summary" "" || bad "MFU in the step line and the summary" "$(tail -2 out.txt)"
"$python" -c '
import json, sys
for r in map(json.loads, open("mfu.jsonl")):
    if "loss" in r:
        assert abs(r["mfu"] - r["model_flops_per_s"] / 1e11) < 1e-6 * r["mfu"], r
        assert abs(r["model_flops_per_s"] * r["step_ms"] / 1e3 - 201326592) < 1e-3 * 201326592, r
' && ok "--log: mfu = model FLOPs / step time / peak" "" || bad "--log: mfu = model FLOPs / step time / peak" "$(head -2 mfu.jsonl)"
# the measured peak is kept per machine; one measured low (while the machine was busy) is raised
# by the first step that beats it, so no step shows an MFU over 100%: plant 1 kFLOP/s
mkdir -p pc && check "the peak measured into an empty cache (fine)" 0 "" env XDG_CACHE_HOME="$PWD/pc" ./exe --steps 1 --threads 1
kept=$(ls pc/ptc/peak_flops_*_t1 2> /dev/null | head -1)
if [ -n "$kept" ]; then
  echo 1000 > "$kept"
  check "a planted low peak (fine)" 0 "" env XDG_CACHE_HOME="$PWD/pc" ./exe --steps 2 --threads 1
  grep -o "MFU [0-9.]*%" out.txt | awk '{ v = $2 + 0; if (v > 100.05) bad = 1 } END { exit bad || NR != 3 }' &&
    grep -Eq "^step +1/2 .* MFU 100\.0% " out.txt &&
    awk '{ exit !($1 > 1e6) }' "$kept" && ok "a step beating the kept peak raises it" "" ||
    bad "a step beating the kept peak raises it" "$(grep -E 'MFU' out.txt | head -3) kept: $(cat "$kept")"
else
  bad "the peak is kept in the cache" "$(ls -R pc | head -5)"
fi
check "--peak-flops 0" 2 "--peak-flops expects a positive number, got '0'" ./exe --steps 1 --peak-flops 0

# (item 11) two runs writing one checkpoint directory at once: the second is refused, naming the
# first; the directory is free again once the first has ended (however it ended)
rm -rf lkdir
./exe --steps 100000 --checkpoint-dir lkdir --quiet > /dev/null 2>&1 &
first=$!
for _ in $(seq 100); do [ -s lkdir/.lock ] && break; sleep 0.05; done
check "a second run in the same --checkpoint-dir" 2 "--checkpoint-dir lkdir: another run \(pid $first\) is writing it" ./exe --steps 1 --checkpoint-dir lkdir
kill -9 $first 2> /dev/null
wait $first 2> /dev/null
check "the same directory after the first was killed (fine)" 0 "" ./exe --steps 1 --checkpoint-dir lkdir --quiet

check "--lr 0" 2 "--lr expects a positive number, got '0'" ./exe --quiet --steps 1 --lr 0
check "--lr 0.0" 2 "--lr expects a positive number, got '0\.0'" ./exe --quiet --steps 1 --lr 0.0
check "--min-lr above the peak" 2 "--min-lr 0\.01 is above the peak learning rate 0\.001 \(--lr\)" ./exe --quiet --steps 1 --lr 1e-3 --min-lr 0.01

check "batch that dp does not divide" 1 "gpt2_tiny\.ptm:[0-9]+:[0-9]+: error: mesh axis dp=3 does not divide .* make const 'batch' a multiple of 3, e\.g\. -D batch=6" "$ptc" --mesh dp=3 "$m"
check "... and -D batch=6 then compiles" 0 "" "$ptc" --mesh dp=3 -D batch=6 "$m"
check "--mesh dp=8192,tp=8" 2 "--mesh: dp=8192 is more than 1024, the most ranks one mesh axis may have" "$ptc" --mesh dp=8192,tp=8 "$m"
check "--mesh tp=0" 2 "--mesh: tp=0: an axis has at least 1 rank" "$ptc" --mesh tp=0 "$m"
check "--mesh xp=2" 2 "--mesh: unknown axis 'xp' in 'xp=2' \(the axes are pp, dp, ep and tp\)" "$ptc" --mesh xp=2 "$m"
check "--mesh dp=2,dp=2" 2 "--mesh: axis dp is given twice" "$ptc" --mesh dp=2,dp=2 "$m"

for pair in "matmul(x, w):'a @ b'" "linear(x, w):'x @ w \+ b'" "layer_norm(x):'layernorm'" "RMSNorm(x):'rmsnorm'" "ln(x):'log'"; do
  call=${pair%%:*} hint=${pair#*:}
  printf 'model m(x: f32[4, 8]) {\n    param w : [8, 8] init normal(0.02)\n    y = %s\n    return mean(mean(y @ w, axis=0), axis=0)\n}\n' "$call" > op.ptm
  check "unknown op ${call%%(*}" 1 "op\.ptm:3:9: error: unknown op or block '${call%%(*}'; did you mean $hint\?" "$ptc" op.ptm
done
printf 'model m(x: f32[4, 8]) {\n    param w : [8, 8] init normal(0.02)\n    y = dropout(x)\n    return mean(mean(y @ w, axis=0), axis=0)\n}\n' > op.ptm
check "unknown op dropout" 1 "op\.ptm:3:9: error: unknown op 'dropout': the language has no dropout" "$ptc" op.ptm
finish
