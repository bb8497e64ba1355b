#!/usr/bin/env bash
# overflow.sh PTC PTC_TOKENIZE SOURCE_DIR - numbers at the edges of their types (issue 9, item 8):
# parameter counts near 2^64 (a model is limited to 2^46 parameters in all, like one tensor), a
# checkpoint whose step is near INT64_MAX (steps are limited to 2^62; the file is resealed with a
# valid checksum by the test tool forge_step, given as PTC_FORGE_STEP), and --optim values that
# the model's optimizer line would refuse. Ids: random targets of ptc --run stay below
# cross_entropy's classes when the embedding has more rows, and a token file's ids are checked
# against the classes as well as the rows.
source "$(dirname "$0")/lib.sh"
forge=${PTC_FORGE_STEP:-$(dirname "$ptc")/../tests/forge_step}
case $forge in /*) ;; *) forge=$start/$forge ;; esac

cat > big.ptm << 'EOF2'
model m(x: f32[4, 8]) {
    param w : [8, 8] init normal(0.02)
    repeat 200000 as h {
        param big : [8388608, 8388608] init zeros
    }
    return mean(mean(x @ w, axis=-1), axis=-1)
}
EOF2
check "200,000 params of 2^46 elements" 1 "big\.ptm:4:15: error: model too large: .* more than 2\^46 parameters in all" "$ptc" big.ptm
check "--emit params of the same" 1 "more than 2\^46 parameters" "$ptc" --emit params big.ptm
grep -q -- "-[0-9]" out.txt && bad "no negative count printed" "$(tail -1 out.txt)" || ok "no negative count printed" ""
cat > edge.ptm << 'EOF2'
model m(x: f32[4, 8]) {
    repeat 2 as h {
        param big : [4194304, 8388608] init zeros
    }
    return mean(mean(x, axis=-1), axis=-1)
}
EOF2
check "exactly 2^46 parameters" 0 "" "$ptc" edge.ptm
grep -q "70,368,744,177,664 parameters" out.txt && ok "2^46 counted exactly" "$(cat out.txt)" || bad "2^46 counted exactly" "$(cat out.txt)"

# ---- a checkpoint at step INT64_MAX ----
make_exe
run=("$exe" --quiet --data train.bin)
if [ ! -x "$forge" ]; then
  bad "forged checkpoints" "no forge_step tool at $forge (set PTC_FORGE_STEP)"
elif ! "${run[@]}" --steps 2 --checkpoint-dir ck > ck.out 2>&1; then
  bad "setup: a checkpoint" "$(head -c 300 ck.out)"
else
  for step in 9223372036854775807 9223372036854775806 4611686018427387905; do
    rm -rf f && mkdir f
    "$forge" ck/step_00000002.safetensors "$step" f/step_00000002.safetensors && echo step_00000002.safetensors > f/latest
    check "resume from a checkpoint at step $step" 2 "step_00000002\.safetensors: step $step out of range \(at most 4611686018427387904\)" "${run[@]}" --steps 3 --resume --checkpoint-dir f
  done
  rm -rf f && mkdir f
  "$forge" ck/step_00000002.safetensors 4611686018427387904 f/step_00000002.safetensors && echo step_00000002.safetensors > f/latest
  # at the limit: loads, and the run (2 steps asked) has nothing left to do
  check "resume from a checkpoint at step 2^62" 0 "" "${run[@]}" --steps 2 --resume --checkpoint-dir f
  check "--steps past 2^62" 2 "--steps expects an integer from 1 to 4611686018427387904" "${run[@]}" --steps 4611686018427387905
fi

# ---- --optim checks what the optimizer line checks ----
m=$src/examples/gpt2_tiny.ptm
check "--optim lr=0" 2 "--optim lr=0: lr must be positive, got 0" "$ptc" --train --optim lr=0 "$m"
check "--optim lr=-1" 2 "--optim lr=-1: lr must be positive" "$ptc" --train --optim lr=-1 "$m"
check "--optim beta1=1" 2 "--optim beta1=1: beta1 must be less than 1, got 1" "$ptc" --train --optim beta1=1 "$m"
check "--optim beta2=1.5" 2 "--optim beta2=1\.5: beta2 must be less than 1" "$ptc" --train --optim beta2=1.5 "$m"
check "--optim eps=nan" 2 "--optim eps=nan: eps must be a finite number" "$ptc" --train --optim eps=nan "$m"
check "--optim momentum for adamw" 2 "--optim momentum=0\.9: unknown setting 'momentum' of adamw" "$ptc" --train --optim momentum=0.9 "$m"
check "--optim beta1 for sgd" 2 "--optim beta1=0\.9: unknown setting 'beta1' of sgd" "$ptc" --train --optim beta1=0.9 "$src/examples/mlp.ptm"
check "--optim weight_decay=0.2 (fine)" 0 "" "$ptc" --train --optim weight_decay=0.2 --emit ir "$m"
grep -q "weight_decay=0.2" out.txt && ok "--optim weight_decay=0.2 is in the step" "" || bad "--optim weight_decay=0.2 is in the step" "not in the IR"
sed 's/optimizer adamw(lr=6e-4/optimizer adamw(lr=0/' "$src/examples/gpt2_tiny.ptm" > lr0.ptm
check "the optimizer line's lr=0 (the same rule)" 1 "lr must be positive, got 0" "$ptc" lr0.ptm

# ---- random ids: targets below cross_entropy's classes, tokens below the embedding's rows ----
cat > cls.ptm << 'EOF2'
model m(tokens: i32[2, 8], targets: i32[2, 8]) {
    param wte : [256, 16] init normal(0.02)
    param head : [16, 10] init normal(0.02)
    return cross_entropy(embedding(wte, tokens) @ head, targets)
}
EOF2
for seed in 1 2 3; do
  check "ptc --run, 256 rows and 10 classes (seed $seed)" 0 "" "$ptc" --run --seed $seed cls.ptm
done
# a token file: every token but the first is also a target, so ids must be below the classes too
printf 'Some text with bytes well above 10.' > cls.txt
"$tokenize" cls.txt -o cls.bin > /dev/null 2>&1 && "$ptc" cls.ptm -o cls_exe > /dev/null 2>&1 ||
  bad "cls.ptm setup" "could not tokenize or compile"
check "--data with tokens past the 10 classes" 2 \
  "cls\.bin: token [0-9]+ at position 0 is not below the vocabulary size 10 \(the model's cross_entropy has 10 classes" \
  ./cls_exe --data cls.bin --steps 1
finish
