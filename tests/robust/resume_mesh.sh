#!/usr/bin/env bash
# resume_mesh.sh PTC PTC_TOKENIZE SOURCE_DIR - checkpoints move between meshes (issue 9, item 10):
# for gpt2_tiny, llama_tiny and bert_tiny (an encoder: its partitioned programs list parameters
# in another order than the single-device one, which the configuration hash depended on), a run
# of 2 steps on one of {1 rank, dp=2,tp=2, dp=4 ZeRO-3} resumes on each of the others to step 4,
# and its steps 3 and 4 must have the losses of an uninterrupted 4-step run on one rank.
source "$(dirname "$0")/lib.sh"
meshes=("" "--mesh dp=2,tp=2" "--mesh dp=4 --zero 3")
names=("1rank" "dp2tp2" "dp4z3")
for model in gpt2_tiny llama_tiny bert_tiny; do
  for k in 0 1 2; do
    # shellcheck disable=SC2086
    "$ptc" ${meshes[$k]} "$src/examples/$model.ptm" -o "$model.${names[$k]}" > /dev/null 2>&1 ||
      bad "$model ${names[$k]}" "does not compile"
  done
  run=(--schedule constant --seed 3 --quiet)
  ./"$model.1rank" --steps 4 "${run[@]}" --log "$model.ref.jsonl" > /dev/null 2>&1 ||
    bad "$model reference run" "failed"
  for a in 0 1 2; do
    for b in 0 1 2; do
      [ $a -eq $b ] && continue
      what="$model ${names[$a]} -> ${names[$b]}"
      rm -rf ck
      ./"$model.${names[$a]}" --steps 2 "${run[@]}" --checkpoint-dir ck > /dev/null 2> err.txt ||
        { bad "$what" "the first run failed: $(head -c 300 err.txt)"; continue; }
      check "$what" 0 "" ./"$model.${names[$b]}" --steps 4 "${run[@]}" --checkpoint-dir ck --resume --log resumed.jsonl
      grep -q "^resumed from .*(step 2)" out.txt || bad "$what: resumed from step 2" "$(head -c 300 out.txt)"
      if msg=$("$python" - "$model.ref.jsonl" resumed.jsonl << 'PY'
import json, sys
def losses(p):
    return {r['step']: r['loss'] for r in map(json.loads, open(p)) if 'loss' in r}
ref, got = losses(sys.argv[1]), losses(sys.argv[2])
if sorted(got) != [3, 4]:
    sys.exit('steps run: %s' % sorted(got))
worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in (3, 4))
print('steps 3-4 relative loss difference %.1e' % worst)
sys.exit(0 if worst < 1e-5 else 1)
PY
      ); then ok "$what: losses of the uninterrupted run" "$msg"; else bad "$what: losses of the uninterrupted run" "$msg"; fi
    done
  done
done
finish
