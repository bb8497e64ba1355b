#!/usr/bin/env bash
# streams.sh PTC PTC_TOKENIZE SOURCE_DIR - inputs that never end or never start (issue 9, item
# 6): an endless device (/dev/zero) or pipe is refused at once or after a bound, never read until
# memory runs out; a FIFO with no writer is refused (token files and checkpoints are mapped, so
# they must be regular files) or read as empty, never waited on. Each command has 20 s. Without
# AddressSanitizer the commands also run under a 2 GB memory limit, so that a build that reads
# without bound fails here rather than exhausting the machine.
source "$(dirname "$0")/lib.sh"
limit=20
make_exe
mkfifo nowriter
if no_asan "$ptc" && no_asan "$exe"; then
  ulimit -v 2000000 # kB; the ASan runtime reserves terabytes of address space, so not under ASan
fi

run=("$exe" --quiet --steps 1)
check "--data /dev/zero" 2 "/dev/zero: not a regular file \(it is a character device\)" "${run[@]}" --data /dev/zero
check "--data a FIFO without a writer" 2 "nowriter: not a regular file \(it is a FIFO\)" "${run[@]}" --data nowriter
check "--val-data a FIFO without a writer" 2 "nowriter: not a regular file" "${run[@]}" --data train.bin --val-data nowriter --val-every 1
check "--init-from a FIFO without a writer" 2 "nowriter: not a regular file" "${run[@]}" --init-from nowriter
check "--init-from /dev/zero" 2 "/dev/zero: not a regular file" "${run[@]}" --init-from /dev/zero

"$ptc" "$src/examples/mlp.ptm" > /dev/null 2>&1
check "ptc --input from /dev/zero" 2 "--input images: /dev/zero: cannot read a character device" "$ptc" --run --input images=/dev/zero "$src/examples/mlp.ptm"
# an endless pipe: read up to the input's size and one byte more, then refused
check "ptc --input from an endless pipe" 2 "--input images: .*larger than the limit of 200704 bytes" bash -c "yes | exec \"\$0\" --run --input images=/dev/stdin \"\$1\"" "$ptc" "$src/examples/mlp.ptm"
check "ptc --input from a FIFO without a writer (empty)" 2 "'nowriter' has 0 bytes, input f32\[64,784\] needs 200704" "$ptc" --run --input images=nowriter "$src/examples/mlp.ptm"
check "ptc /dev/zero as the model" 2 "/dev/zero: cannot read a character device" "$ptc" /dev/zero
check "ptc an endless pipe as the model" 2 "/dev/stdin: larger than the limit of 67108864 bytes" bash -c "yes | exec \"\$0\" /dev/stdin" "$ptc"
check "ptc a FIFO without a writer as the model (empty)" 1 "nowriter:1:1: error: no model in this file" "$ptc" nowriter
check "ptc a model from a pipe" 0 "" bash -c "cat \"\$1\" | exec \"\$0\" /dev/stdin" "$ptc" "$src/examples/mlp.ptm"
grep -q "/dev/stdin: model 'mlp', 203,530 parameters" out.txt && ok "ptc a model from a pipe: compiled" "" || bad "ptc a model from a pipe: compiled" "$(cat out.txt)"
check "ptc-tokenize /dev/zero" 2 "/dev/zero: cannot read a character device" "$tokenize" /dev/zero -o z.bin
check "ptc-tokenize a FIFO without a writer (empty)" 2 "nowriter: is empty" "$tokenize" nowriter -o z.bin
check "ptc-tokenize from a pipe" 0 "" bash -c "exec \"\$0\" /dev/stdin -o p.bin < slice.txt" "$tokenize"
cmp -s p.bin train.bin && ok "ptc-tokenize from a pipe: the same tokens" "" || bad "ptc-tokenize from a pipe: the same tokens" "p.bin differs from train.bin"
finish
