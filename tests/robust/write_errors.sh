#!/usr/bin/env bash
# write_errors.sh PTC PTC_TOKENIZE SOURCE_DIR - a write that fails is an error (issue 9, item 9):
# standard output on a full disk (/dev/full) or closed gives a message and a failing exit status,
# never exit 0 with a truncated output; a --save or -o onto a full device too. (The runner's
# --log is written by the training loop and is not covered here.)
source "$(dirname "$0")/lib.sh"
if [ ! -c /dev/full ]; then
  bad "setup" "no /dev/full on this machine"
  finish
  exit
fi
make_exe
m=$src/examples/gpt2_tiny.ptm
full=(bash -c 'exec "$@" > /dev/full' full) # "${full[@]}" CMD...: CMD's standard output on a full disk
for kind in ir dot params plan plan-json; do
  check "ptc --emit $kind > /dev/full" 2 "ptc: error: writing to standard output failed: No space left on device" "${full[@]}" "$ptc" --emit "$kind" "$m"
done
check "ptc (the summary) > /dev/full" 2 "writing to standard output failed: No space left on device" "${full[@]}" "$ptc" "$m"
check "ptc --run (the loss) > /dev/full" 2 "writing to standard output failed" "${full[@]}" "$ptc" --run "$m"
check "ptc --help > /dev/full" 2 "writing to standard output failed" "${full[@]}" "$ptc" --help
check "ptc --emit ir >&- (closed)" 2 "writing to standard output failed: Bad file descriptor" bash -c "exec \"\$0\" --emit ir \"\$1\" >&-" "$ptc" "$m"
check "ptc -o x > /dev/full (the 'wrote' line)" 2 "writing to standard output failed" "${full[@]}" "$ptc" "$m" -o x
check "ptc-tokenize > /dev/full" 2 "ptc-tokenize: writing to standard output failed: No space left on device" "${full[@]}" "$tokenize" slice.txt -o t.bin
check "runner --print-plan > /dev/full" 2 "writing to standard output failed: No space left on device" "${full[@]}" "$exe" --print-plan
check "runner --help > /dev/full" 2 "writing to standard output failed" "${full[@]}" "$exe" --help
check "runner progress lines > /dev/full" 1 "writing to standard output failed: No space left on device" "${full[@]}" "$exe" --steps 2
check "runner --quiet > /dev/full (the summary line)" 1 "writing to standard output failed: No space left on device" "${full[@]}" "$exe" --steps 1 --quiet
if device fulldev 1 7; then
  check "--save onto a full device" 1 "fulldev: write failed: No space left on device" "$exe" --quiet --steps 1 --save fulldev
  is_chardev fulldev && ok "--save: the full device is still a device" "" || bad "--save: the full device is still a device" "$(ls -l fulldev)"
  check "ptc-tokenize -o onto a full device" 2 "fulldev: write failed: No space left on device" "$tokenize" slice.txt -o fulldev
else
  echo "SKIP writes onto a full device (making a device node needs root)"
fi
finish
