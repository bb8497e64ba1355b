#!/usr/bin/env bash
# checkpoint_dir.sh PTC PTC_TOKENIZE SOURCE_DIR - an empty --checkpoint-dir (issue 9, item 3) was
# scanned past its end (found by AddressSanitizer) and, without it, made checkpoints named
# "/step_...": it is refused, like every empty path, before the first step. A checkpoint directory
# that cannot be made is refused then too, not at the first checkpoint.
source "$(dirname "$0")/lib.sh"
make_exe
run=("$exe" --quiet --steps 2)
before=$(ls / | tr '\n' ' ')
check "--checkpoint-dir ''" 2 "--checkpoint-dir expects a directory name, got ''" "${run[@]}" --checkpoint-dir ''
check "--checkpoint-dir '' --resume" 2 "--checkpoint-dir expects a directory name, got ''" "${run[@]}" --checkpoint-dir '' --resume
[ "$(ls / | tr '\n' ' ')" = "$before" ] && ok "nothing was written at /" "" || bad "nothing was written at /" "$(ls / | tr '\n' ' ')"
for flag in --data --val-data --init-from --save --log --dump-grads; do
  check "$flag ''" 2 "$flag expects a (file|directory) name, got ''" "${run[@]}" "$flag" ''
done
: > plain
check "--checkpoint-dir under a regular file" 2 "--checkpoint-dir plain/ck: cannot be created: plain is a regular file" "${run[@]}" --checkpoint-dir plain/ck
check "--checkpoint-dir is a regular file" 2 "--checkpoint-dir plain: is a regular file, not a directory" "${run[@]}" --checkpoint-dir plain
check "--checkpoint-dir in new directories" 0 "" "${run[@]}" --checkpoint-dir new/a/b
[ -f new/a/b/step_00000002.safetensors ] && ok "--checkpoint-dir new/a/b: written" "" || bad "--checkpoint-dir new/a/b: written" "$(ls -R new 2>&1 | head -5)"
finish
