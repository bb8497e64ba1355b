#!/usr/bin/env bash
# outputs.sh PTC PTC_TOKENIZE SOURCE_DIR - every output is written the way its target calls for
# (issue 9, item 2): a regular file is replaced atomically (a symbolic link keeps pointing at the
# new file), a FIFO or a character device is written straight through and stays what it was, a
# directory is refused, and an output that is also an input (the model, the data, the weights
# being loaded, the executable itself) is refused before anything is written. Device nodes are
# made here (never the system's /dev/null), which needs root; without it those cases are skipped
# and said so.
source "$(dirname "$0")/lib.sh"
make_exe

# ---- ptc -o ----
cp "$src/examples/mlp.ptm" model.ptm
cp model.ptm model.orig
mkfifo ofifo
check "ptc -o onto its own model" 2 "-o model\.ptm: is the model being compiled" "$ptc" model.ptm -o model.ptm
cmp -s model.ptm model.orig && ok "ptc -o: the model is unchanged" "cmp" || bad "ptc -o: the model is unchanged" "model.ptm was replaced"
check "ptc -o onto a FIFO" 2 "-o ofifo: is a FIFO; -o writes an executable file" "$ptc" model.ptm -o ofifo
is_fifo ofifo && ok "ptc -o: the FIFO is still a FIFO" "" || bad "ptc -o: the FIFO is still a FIFO" "$(ls -l ofifo)"
mkdir adir
check "ptc -o onto a directory" 2 "-o adir: is a directory" "$ptc" model.ptm -o adir
check "ptc -o into a missing directory" 2 "-o nodir/x: cannot create it in directory nodir" "$ptc" model.ptm -o nodir/x
if device nulldev 1 3; then
  check "ptc -o onto a character device" 2 "-o nulldev: is a character device" "$ptc" model.ptm -o nulldev
  is_chardev nulldev && ok "ptc -o: the device is still a device" "" || bad "ptc -o: the device is still a device" "$(ls -l nulldev)"
else
  echo "SKIP ptc -o onto a character device (making a device node needs root)"
fi

# ---- the runner's --save ----
run=("$exe" --quiet --steps 1)
cp train.bin train.orig
check "--save onto the --data file" 2 "--save train\.bin: is the --data file; refusing" "${run[@]}" --data train.bin --save train.bin
cmp -s train.bin train.orig && ok "--save: the data is unchanged" "" || bad "--save: the data is unchanged" "train.bin was replaced"
"${run[@]}" --save w0.safetensors > /dev/null 2>&1 && cp w0.safetensors w0.orig
check "--save onto the --init-from file" 2 "--save w0\.safetensors: is the --init-from file" "${run[@]}" --init-from w0.safetensors --save w0.safetensors
cmp -s w0.safetensors w0.orig && ok "--save: the initial weights are unchanged" "" || bad "--save: the initial weights are unchanged" "w0.safetensors was replaced"
cp "$exe" exe.orig
check "--save onto the executable itself" 2 "is this executable; refusing" "${run[@]}" --save "$exe"
cmp -s "$exe" exe.orig && ok "--save: the executable is unchanged" "" || bad "--save: the executable is unchanged" "replaced"
check "--save onto a directory" 2 "--save adir: is a directory" "${run[@]}" --save adir
t0=$(date +%s)
check "--save into a missing directory (before the run)" 2 "--save nodir/w\.safetensors: cannot create it in directory nodir" "${run[@]}" --steps 50 --save nodir/w.safetensors
[ $(($(date +%s) - t0)) -lt 20 ] && ok "--save checked before the steps" "" || bad "--save checked before the steps" "took $(($(date +%s) - t0)) s"
check "--log onto the --data file (it was SIGBUS)" 2 "--log train\.bin: is the --data file" "${run[@]}" --data train.bin --log train.bin
check "--log and --save one file" 2 "--save w1\.st: is the --log file" "${run[@]}" --save w1.st --log ./w1.st
mkfifo sfifo
read_fifo sfifo got.safetensors
check "--save onto a FIFO (a reader takes the weights)" 0 "" timeout 60 "${run[@]}" --save sfifo
sleep 0.2
stop_reader
is_fifo sfifo && ok "--save: the FIFO is still a FIFO" "" || bad "--save: the FIFO is still a FIFO" "$(ls -l sfifo)"
size=$(stat -c %s got.safetensors 2> /dev/null || echo 0)
[ "$size" -gt 400000 ] && ok "--save: the FIFO's reader got the weights" "$size bytes" || bad "--save: the FIFO's reader got the weights" "$size bytes"
if device nulldev2 1 3; then
  check "--save onto a character device" 0 "" "${run[@]}" --save nulldev2
  is_chardev nulldev2 && ok "--save: the device is still a device" "" || bad "--save: the device is still a device" "$(ls -l nulldev2)"
  ls nulldev2.tmp.* > /dev/null 2>&1 && bad "--save: no temporary file beside a device" "$(ls nulldev2.tmp.*)" || ok "--save: no temporary file beside a device" ""
else
  echo "SKIP --save onto a character device (making a device node needs root)"
fi
"${run[@]}" --save target.safetensors > /dev/null 2>&1
ln -s target.safetensors link.safetensors
check "--save onto a symbolic link" 0 "" "${run[@]}" --seed 7 --save link.safetensors
[ -L link.safetensors ] && ! cmp -s target.safetensors w0.orig && ok "--save: the link still points at the replaced file" "" ||
  bad "--save: the link still points at the replaced file" "$(ls -l link.safetensors target.safetensors)"

# ---- ptc-tokenize -o ----
cp slice.txt text.orig
check "ptc-tokenize -o onto its input" 2 "slice\.txt: is the input file; refusing" "$tokenize" slice.txt -o slice.txt
cmp -s slice.txt text.orig && ok "ptc-tokenize: the text is unchanged" "" || bad "ptc-tokenize: the text is unchanged" "slice.txt was replaced"
check "ptc-tokenize --val-output onto its input" 2 "slice\.txt: is the input file" "$tokenize" slice.txt -o t.bin --val-fraction 0.1 --val-output slice.txt
check "ptc-tokenize -o and --val-output one file" 2 "v\.bin: given as both" "$tokenize" slice.txt -o v.bin --val-fraction 0.1 --val-output ./v.bin
check "ptc-tokenize -o onto a directory" 2 "adir: is a directory" "$tokenize" slice.txt -o adir
mkfifo tfifo
read_fifo tfifo got.bin
check "ptc-tokenize -o onto a FIFO" 0 "" timeout 60 "$tokenize" slice.txt -o tfifo
sleep 0.2
stop_reader
is_fifo tfifo && cmp -s got.bin train.bin && ok "ptc-tokenize: the FIFO's reader got the tokens" "" ||
  bad "ptc-tokenize: the FIFO's reader got the tokens" "$(ls -l tfifo got.bin)"
"$tokenize" slice.txt -o tokens.bin > /dev/null 2>&1
ln -s tokens.bin tlink.bin
head -c 5000 slice.txt > small.txt
check "ptc-tokenize -o onto a symbolic link" 0 "" "$tokenize" small.txt -o tlink.bin
[ -L tlink.bin ] && [ "$(stat -c %s tokens.bin)" -eq $((1024 + 2 * 5000)) ] && ok "ptc-tokenize: the link's target got the tokens" "" ||
  bad "ptc-tokenize: the link's target got the tokens" "$(ls -l tlink.bin tokens.bin)"
finish
