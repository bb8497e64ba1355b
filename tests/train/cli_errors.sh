#!/usr/bin/env bash
# cli_errors.sh PTC PTC_TOKENIZE SOURCE_DIR - error handling of ptc and of the executables it
# writes: every bad flag, bad value and bad file must be refused with the documented exit status
# (2: bad command line or file; 1: failure during the run, or a model error for ptc) and a message
# that names the flag or file and the problem; nothing may crash.
#
# Test files (token files with a bad header, edited safetensors files) are made with python3's
# standard library. Prints one line per case, PASS or FAIL, and ends with "N passed, M failed".
# Exit 0 when nothing failed, 1 otherwise.
set -u -o pipefail

ptc=${1:?usage: cli_errors.sh PTC PTC_TOKENIZE SOURCE_DIR}
tokenize=${2:?usage: cli_errors.sh PTC PTC_TOKENIZE SOURCE_DIR}
src=${3:?usage: cli_errors.sh PTC PTC_TOKENIZE SOURCE_DIR}
abs() { case $1 in /*) echo "$1" ;; */*) echo "$PWD/$1" ;; *) command -v "$1" || echo "$1" ;; esac; }
ptc=$(abs "$ptc") tokenize=$(abs "$tokenize") src=$(cd "$src" && pwd) || exit 2
python=$(command -v python3 || echo /usr/bin/python3)

work=$(mktemp -d "${TMPDIR:-/tmp}/ptc-cli.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
cd "$work" || exit 1

pass=0 failed=0
# check NAME WANT_RC REGEX CMD...: runs CMD (stdin from /dev/null); passes when it exits WANT_RC
# and its stderr matches the extended regular expression REGEX (grep -E, case-sensitive; "" for
# any stderr).
check() {
  local name=$1 want=$2 re=$3
  shift 3
  "$@" > out.txt 2> err.txt < /dev/null
  local rc=$?
  local msg
  msg=$(grep -v '^(see .* --help)$' err.txt | head -n 4 | cut -c 1-300 | tr '\n' '|' | sed 's/|$//')
  if [ $rc -eq "$want" ] && { [ -z "$re" ] || grep -Eq -- "$re" err.txt; }; then
    pass=$((pass + 1))
    echo "PASS $name: exit $rc: $msg"
  else
    failed=$((failed + 1))
    if [ $rc -ne "$want" ]; then
      echo "FAIL $name: exit $rc, expected $want; stderr: ${msg:-(empty)}"
    else
      echo "FAIL $name: exit $rc as expected, but stderr does not match /$re/: ${msg:-(empty)}"
    fi
    [ $rc -lt 128 ] || echo "     (killed by signal $((rc - 128)): a crash)"
  fi
}
# ok NAME CONDITION_DESCRIPTION: records a passing check made by the caller; bad NAME WHY: a failing one.
ok() { pass=$((pass + 1)); echo "PASS $1: $2"; }
bad() { failed=$((failed + 1)); echo "FAIL $1: $2"; }

# ---- setup: the executable and good data ----
exe=$work/gpt2_tiny
if ! "$ptc" "$src/examples/gpt2_tiny.ptm" -o "$exe" > compile.out 2>&1; then
  cat compile.out
  echo "FAIL setup: ptc could not compile examples/gpt2_tiny.ptm"
  echo "0 passed, 1 failed"
  exit 1
fi
head -c 20000 "$src/examples/data/corpus.txt" > slice.txt
if ! "$tokenize" slice.txt -o train.bin > tok.out 2>&1; then
  cat tok.out
  echo "FAIL setup: ptc-tokenize failed"
  echo "0 passed, 1 failed"
  exit 1
fi
have_py=1
if ! "$python" -c 'import json, struct' 2> /dev/null; then
  have_py=0
  echo "note: no python3: the cases that need hand-made files are skipped"
fi
run=("$exe" --quiet --steps 2) # a short run; flags under test come after

# ---- 1. flags of the executable: exit 2, message names the flag ----
check "unknown flag" 2 "unknown option '--bogus'" "${run[@]}" --bogus
check "--steps 0" 2 "^.*--steps.*'0'" "${run[@]}" --steps 0
check "--steps abc" 2 "--steps.*'abc'" "${run[@]}" --steps abc
check "--steps 1e3 (not an integer)" 2 "--steps.*'1e3'" "${run[@]}" --steps 1e3
check "--steps out of range" 2 "--steps.*'99999999999999999999'" "${run[@]}" --steps 99999999999999999999
check "--lr -1" 2 "--lr.*'-1'" "${run[@]}" --lr -1
check "--lr nan" 2 "--lr.*'nan'" "${run[@]}" --lr nan
check "--lr inf" 2 "--lr.*'inf'" "${run[@]}" --lr inf
check "--lr 3x" 2 "--lr.*'3x'" "${run[@]}" --lr 3x
check "--min-lr -0.5" 2 "--min-lr.*'-0.5'" "${run[@]}" --min-lr -0.5
check "--grad-clip -1" 2 "--grad-clip.*'-1'" "${run[@]}" --grad-clip -1
check "--seed -1" 2 "--seed.*'-1'" "${run[@]}" --seed -1
check "--warmup -1" 2 "--warmup.*'-1'" "${run[@]}" --warmup -1
check "--val-batches 0" 2 "--val-batches.*'0'" "${run[@]}" --val-batches 0
check "--keep -1" 2 "--keep.*'-1'" "${run[@]}" --keep -1
check "--threads x" 2 "--threads.*'x'" "${run[@]}" --threads x
check "--schedule foo" 2 "--schedule.*'foo'" "${run[@]}" --schedule foo
check "--backend gpu" 2 "--backend.*'gpu'" "${run[@]}" --backend gpu
check "--matmul-precision low" 2 "--matmul-precision expects highest, high or medium.*'low'" "${run[@]}" --matmul-precision low
check "missing value (--steps last)" 2 "'--steps' needs a value" "${run[@]}" --steps
check "missing value (--data last)" 2 "'--data' needs a value" "${run[@]}" --data
check "--resume without --checkpoint-dir" 2 "--resume needs --checkpoint-dir" "${run[@]}" --resume
check "--val-every without --val-data" 2 "--val-every needs --val-data" "${run[@]}" --val-every 5
# --keep is an int: a value past INT_MAX must be refused, or honoured (keep all 3 of 3), never
# wrapped around (4294967297 would become 1)
rm -rf keepdir
"${run[@]}" --steps 3 --checkpoint-every 1 --checkpoint-dir keepdir --keep 4294967297 > out.txt 2> err.txt
rc=$?
nkept=$(find keepdir -name 'step_*.safetensors' 2> /dev/null | wc -l)
if { [ $rc -eq 2 ] && grep -q -- '--keep' err.txt; } || { [ $rc -eq 0 ] && [ "$nkept" -eq 3 ]; }; then
  ok "--keep 4294967297" "exit $rc, $nkept of 3 checkpoints kept"
else
  bad "--keep 4294967297" "exit $rc and $nkept of 3 checkpoints kept (expected exit 2 naming --keep, or all 3 kept; 4294967297 wraps to 1 in an int) $(head -c 200 err.txt)"
fi

# ---- 2. data files: exit 2, message names the file and the problem ----
check "missing data file" 2 "nosuch\\.bin: cannot open: No such file" "${run[@]}" --data nosuch.bin
mkdir -p adir
check "data file is a directory" 2 "adir: not a regular file" "${run[@]}" --data adir
if [ $have_py -eq 1 ]; then
  "$python" - << 'EOF' || echo "FAIL setup: python could not write the token files"
import struct
def tokfile(path, tokens, magic=20240520, version=1, count=None, extra=b""):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(tokens), *tokens) + extra)
ok = [(i * 7) % 256 for i in range(1000)]
tokfile("badmagic.bin", ok, magic=20240521)
tokfile("badversion.bin", ok, version=2)
tokfile("truncated.bin", ok, count=2000)                 # header promises more than is there
tokfile("trailing.bin", ok, extra=b"\x00\x01\x02\x03")   # bytes after the last token
tokfile("negcount.bin", ok, count=-5)
tokfile("bigtoken.bin", ok[:500] + [300] + ok[500:])     # id 300 >= vocab 256 at position 500
tokfile("small.bin", ok[:100])                           # 100 tokens; one batch needs 4*64+1
tokfile("exact.bin", ok[:257])                           # exactly one batch: fine
open("short.bin", "wb").write(struct.pack("<3i", 20240520, 1, 0))  # shorter than the header
EOF
  check "bad magic" 2 "badmagic\\.bin: bad magic number 20240521" "${run[@]}" --data badmagic.bin
  check "wrong version" 2 "badversion\\.bin: unsupported version 2" "${run[@]}" --data badversion.bin
  check "truncated token file" 2 "truncated\\.bin: .*2000 tokens.*truncated" "${run[@]}" --data truncated.bin
  check "bytes after the tokens" 2 "trailing\\.bin: file has 2004 bytes of tokens, header says 1000" "${run[@]}" --data trailing.bin
  check "negative token count" 2 "negcount\\.bin: header says -5 tokens" "${run[@]}" --data negcount.bin
  check "shorter than the header" 2 "short\\.bin: .*too short for the 1024-byte header" "${run[@]}" --data short.bin
  check "token id >= vocab" 2 "bigtoken\\.bin: token 300 at position 500 is not below the vocabulary size 256" "${run[@]}" --data bigtoken.bin
  check "too small for one batch" 2 "small\\.bin: 100 tokens are too few for one batch of 4 x 64 \\(needs 257" "${run[@]}" --data small.bin
  check "exactly one batch (accepted)" 0 "" "${run[@]}" --data exact.bin
  check "bad --val-data (magic)" 2 "badmagic\\.bin: bad magic" "${run[@]}" --data train.bin --val-data badmagic.bin --val-every 1
  check "--val-data too small" 2 "small\\.bin: 100 tokens are too few" "${run[@]}" --data train.bin --val-data small.bin --val-every 1
else
  echo "SKIP token files with bad headers (no python3)"
fi
"$ptc" "$src/examples/mlp.ptm" -o mlp > /dev/null 2>&1 &&
  check "--data for a model without token input" 2 "--data needs a model with a token input" ./mlp --quiet --steps 1 --data train.bin
check "--log in a missing directory" 2 "--log: cannot open 'nodir/log\\.jsonl'" "${run[@]}" --data train.bin --log nodir/log.jsonl

# ---- 3. checkpoints: corrupted ones are refused on --resume with exit 2 ----
if ! "$exe" --quiet --data train.bin --steps 2 --checkpoint-dir ck > ck.out 2>&1 || [ ! -f ck/step_00000002.safetensors ]; then
  bad "setup: checkpoint" "could not write ck/step_00000002.safetensors: $(head -c 300 ck.out)"
else
  ck=step_00000002.safetensors
  size=$(stat -c %s "ck/$ck")
  hlen=$(od -An -t u8 -N 8 "ck/$ck" | tr -d ' ')
  resume=("$exe" --quiet --data train.bin --steps 4 --resume)
  # fresh DIR: a copy of ck to damage
  fresh() { rm -rf "$1" && cp -r ck "$1"; }
  # flipbyte FILE OFFSET: xor one byte with 0x01
  flipbyte() {
    local b
    b=$(od -An -t u1 -j "$2" -N 1 "$1" | tr -d ' ')
    # shellcheck disable=SC2059 # the format is the octal escape of the new byte
    printf "$(printf '\\%03o' $((b ^ 1)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
  }
  fresh ok1
  check "resume from an intact checkpoint" 0 "" "${resume[@]}" --checkpoint-dir ok1

  fresh flip
  flipbyte "flip/$ck" $((8 + hlen + (size - 8 - hlen) / 2)) # the middle of the data section
  cp flip/latest flip.latest
  cmp -s "ck/$ck" "flip/$ck" && bad "setup: flip" "the byte flip did not change the file"
  check "one byte flipped in the tensor data" 2 "flip/$ck: checksum mismatch \\(file corrupted\\?\\)" "${resume[@]}" --checkpoint-dir flip
  # (.lock: the run's lock on the directory, not a checkpoint)
  if cmp -s flip.latest flip/latest && [ "$(find flip -newer flip.latest ! -name .lock | wc -l)" -eq 0 ]; then
    ok "refused resume leaves the directory alone" "latest and the files unchanged"
  else
    bad "refused resume leaves the directory alone" "flip/ was modified: $(ls flip)"
  fi

  fresh flipm # a metadata value in the header: "ptc.step":"2" -> "3" (the checksum covers it)
  off=$(grep -abo '"ptc.step":"2"' "flipm/$ck" | head -n 1 | cut -d: -f1)
  if [ -n "$off" ]; then
    flipbyte "flipm/$ck" $((off + 12)) # '2' ^ 1 = '3'
    check "step in the metadata changed" 2 "flipm/$ck: checksum mismatch" "${resume[@]}" --checkpoint-dir flipm
  else
    bad "step in the metadata changed" "no \"ptc.step\":\"2\" in the header"
  fi

  fresh trunc
  truncate -s $((size - 100)) "trunc/$ck"
  check "truncated checkpoint (100 bytes short)" 2 "trunc/$ck: .*(truncated|corrupt|checksum)" "${resume[@]}" --checkpoint-dir trunc
  fresh trunch
  truncate -s 3000 "trunch/$ck"
  check "truncated checkpoint (inside the header)" 2 "trunch/$ck: .*(truncated|corrupt|checksum|larger than the rest of the file)" "${resume[@]}" --checkpoint-dir trunch
  fresh trunc0
  truncate -s 4 "trunc0/$ck"
  check "truncated checkpoint (4 bytes)" 2 "trunc0/$ck: .*too short" "${resume[@]}" --checkpoint-dir trunc0
  fresh tail
  printf 'garbage' >> "tail/$ck"
  check "bytes appended to a checkpoint" 2 "tail/$ck: " "${resume[@]}" --checkpoint-dir tail
  fresh lat1
  echo garbage > lat1/latest
  check "latest holds garbage" 2 "lat1/latest: names 'garbage', which is not a checkpoint file name" "${resume[@]}" --checkpoint-dir lat1
  fresh lat2
  echo step_00000009.safetensors > lat2/latest
  check "latest names a missing file" 2 "lat2/latest: names 'step_00000009.safetensors', which is missing" "${resume[@]}" --checkpoint-dir lat2
  fresh seed
  check "resume with another --seed" 2 "seed/$ck: saved by a different model or training setup" "${resume[@]}" --checkpoint-dir seed --seed 5
  fresh seed2
  head -c 10000 slice.txt > other.txt && "$tokenize" other.txt -o other.bin > /dev/null
  check "resume with another data file" 2 "seed2/$ck: saved by a different model or training setup" "$exe" --quiet --data other.bin --steps 4 --resume --checkpoint-dir seed2
  check "resume from an empty directory starts afresh" 0 "" "${resume[@]}" --checkpoint-dir emptydir
  check "--init-from a corrupted checkpoint" 2 "flip/$ck: checksum mismatch" "$exe" --quiet --steps 1 --init-from "flip/$ck"
  check "--init-from a missing file" 2 "nosuch\\.safetensors: " "$exe" --quiet --steps 1 --init-from nosuch.safetensors
  : > notdir # refused before the first step (they were found only when the run wrote them)
  check "checkpoint dir under a file" 2 "--checkpoint-dir notdir/ck: .*notdir is a regular file" "$exe" --quiet --steps 1 --checkpoint-dir notdir/ck
  check "--save under a file" 2 "--save notdir/w\\.safetensors: .*Not a directory" "$exe" --quiet --steps 1 --save notdir/w.safetensors

  # ---- 4. --init-from with hand-edited safetensors files (python3, standard library) ----
  if [ $have_py -eq 1 ]; then
    "$python" - "ck/$ck" << 'EOF' || echo "FAIL setup: python could not write the safetensors files"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
data = raw[8 + n:]
tensors = {k: v for k, v in hdr.items() if k != "__metadata__"}
def blob(name):
    b, e = tensors[name]["data_offsets"]
    return data[b:e]
params = {k: (v["dtype"], v["shape"], blob(k)) for k, v in tensors.items() if not k.startswith("optim.")}
def write(path, ts, meta=None):
    """ts: {name: (dtype, shape, bytes)}, written as a plain safetensors file (no ptc metadata,
    hence no checksum, like a file saved by PyTorch)."""
    h, out, off = {}, [], 0
    if meta:
        h["__metadata__"] = meta
    for name, (dt, shape, b) in ts.items():
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        out.append(b)
        off += len(b)
    j = json.dumps(h).encode()
    j += b" " * (-len(j) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(j)) + j + b"".join(out))
write("plain.safetensors", params)                      # every parameter: loads
missing = dict(params); del missing["wpe"]; del missing["h.1.mlp.b_fc"]
write("missing.safetensors", missing)
extra = dict(params); extra["h.2.attn.w_qkv"] = ("F32", [64, 192], b"\0" * (64 * 192 * 4))
write("extra.safetensors", extra)
shape = dict(params); dt, sh, b = params["wte"]; shape["wte"] = (dt, [128, 64], b[:128 * 64 * 4])
write("shape.safetensors", shape)
allthree = dict(missing); allthree["h.2.attn.w_qkv"] = extra["h.2.attn.w_qkv"]; allthree["wte"] = shape["wte"]
write("all3.safetensors", allthree)
ints = dict(params); ints["wpe"] = ("I32", params["wpe"][1], params["wpe"][2])
write("int.safetensors", ints)
half = dict(params)                                     # F16 is accepted and converted
dt, sh, b = params["wpe"]
vals = struct.unpack("<%df" % (len(b) // 4), b)
half["wpe"] = ("F16", sh, struct.pack("<%de" % len(vals), *vals))
write("f16.safetensors", half)
# ptc metadata without its checksum: the checksum key itself was damaged
write("nosum.safetensors", params, {"ptc.format": "1", "ptc.step": "2"})
EOF
    init=("$exe" --quiet --steps 1 --init-from)
    check "--init-from a checkpoint" 0 "" "${init[@]}" "ck/$ck"
    check "--init-from plain safetensors (all parameters)" 0 "" "${init[@]}" plain.safetensors
    check "--init-from F16 tensor (converted)" 0 "" "${init[@]}" f16.safetensors
    # the values arrive: with --lr 1e-30 (lr must be positive; an update of at most 1e-30 leaves
    # every weight as it was, a zero one within 1e-25) --save writes back what was loaded
    check "--init-from F16 + --save (lr 1e-30)" 0 "" "${init[@]}" f16.safetensors --lr 1e-30 --save rt.safetensors
    if "$python" - rt.safetensors plain.safetensors f16.safetensors << 'EOF2'; then
import json, struct, sys
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    d = raw[8 + n:]
    return {k: (v["dtype"], d[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items() if k != "__metadata__"}
rt, plain, half = (load(p) for p in sys.argv[1:])
bad = []
for name, (dt, b) in plain.items():
    want = b
    if name == "wpe":  # F16 in the file: the F32 value of each half
        hb = half[name][1]
        want = struct.pack("<%df" % (len(hb) // 2), *struct.unpack("<%de" % (len(hb) // 2), hb))
    got = rt.get(name, (None, None))[1]
    if got is None or len(got) != len(want):
        bad.append(name)
        continue
    k = len(want) // 4
    if any(abs(a - b) > 1e-25 for a, b in zip(struct.unpack("<%df" % k, got), struct.unpack("<%df" % k, want))):
        bad.append(name)
if set(rt) != set(plain) or bad:
    print("differ:", bad[:5], sorted(set(rt) ^ set(plain))[:5])
    sys.exit(1)
EOF2
      ok "--init-from values round-trip" "every parameter saved as loaded (wpe as its F16 values)"
    else
      bad "--init-from values round-trip" "rt.safetensors differs from what --init-from was given"
    fi
    check "--init-from: missing tensors" 2 "missing\\.safetensors: missing tensor 'wpe' \\(expected \\[64,64\\]\\)" "${init[@]}" missing.safetensors
    if grep -q "missing tensor 'h.1.mlp.b_fc'" err.txt; then
      ok "--init-from: both missing tensors listed" "wpe and h.1.mlp.b_fc"
    else
      bad "--init-from: both missing tensors listed" "$(head -c 300 err.txt)"
    fi
    check "--init-from: extra tensor" 2 "extra\\.safetensors: unexpected tensor 'h\\.2\\.attn\\.w_qkv' \\[64,192\\]" "${init[@]}" extra.safetensors
    check "--init-from: wrong shape" 2 "shape\\.safetensors: tensor 'wte' has shape \\[128,64\\], model expects \\[256,64\\]" "${init[@]}" shape.safetensors
    check "--init-from: missing + extra + wrong shape" 2 "all3\\.safetensors" "${init[@]}" all3.safetensors
    n3=$(grep -c -e "missing tensor 'wpe'" -e "missing tensor 'h.1.mlp.b_fc'" -e "unexpected tensor 'h.2.attn.w_qkv'" -e "tensor 'wte' has shape" err.txt)
    if [ "$n3" -eq 4 ]; then
      ok "--init-from: all four problems listed at once" "4 lines"
    else
      bad "--init-from: all four problems listed at once" "$n3 of 4 found: $(tr '\n' '|' < err.txt | head -c 400)"
    fi
    check "--init-from: integer tensor" 2 "int\\.safetensors: tensor 'wpe' is I32, model expects floating point" "${init[@]}" int.safetensors
    check "--init-from: ptc metadata without checksum" 2 "nosum\\.safetensors: has ptc metadata but no ptc\\.checksum" "${init[@]}" nosum.safetensors
  else
    echo "SKIP --init-from with edited safetensors files (no python3)"
  fi
fi

# ---- 5. a diverging run exits 1 ----
check "diverging run (--lr 1e6)" 1 "training diverged" "$exe" --quiet --data train.bin --steps 20 --lr 1e6

# ---- 6. ptc itself ----
sed 's/transpose(wte)/transpose(wtf)/' "$src/examples/gpt2_tiny.ptm" > bad.ptm
line=$(grep -n 'transpose(wtf)' bad.ptm | cut -d: -f1)
col=$(($(grep 'transpose(wtf)' bad.ptm | sed 's/wtf.*//' | wc -c)))
check "ptc: model error" 1 "^bad\\.ptm:$line:$col: error: unknown name 'wtf'" "$ptc" bad.ptm -o badexe
if [ -e badexe ]; then
  bad "ptc: no executable after a model error" "badexe was written"
else
  ok "ptc: no executable after a model error" "nothing written"
fi
check "ptc nosuchfile.ptm" 2 "nosuchfile\\.ptm" "$ptc" nosuchfile.ptm
check "ptc --emit foo" 2 "--emit.*'foo'" "$ptc" --emit foo x.ptm
check "ptc without a file" 2 "no input file" "$ptc"
check "ptc unknown flag" 2 "unknown option '--bogus'" "$ptc" --bogus "$src/examples/gpt2_tiny.ptm"
check "ptc -o without value" 2 "'-o' needs a value" "$ptc" "$src/examples/gpt2_tiny.ptm" -o
check "ptc -o into a missing directory" 2 "nodir/x" "$ptc" "$src/examples/gpt2_tiny.ptm" -o nodir/x
check "ptc on a directory" 2 "adir.*([Ii]s a directory|not a regular file)" "$ptc" adir
check "ptc-tokenize: missing input" 2 "nosuch\\.txt: cannot read: No such file" "$tokenize" nosuch.txt -o x.bin
: > empty.txt
check "ptc-tokenize: empty input" 2 "empty\\.txt: is empty" "$tokenize" empty.txt -o x.bin
check "ptc-tokenize: bad --val-fraction" 2 "--val-fraction.*'2'" "$tokenize" slice.txt -o x.bin --val-fraction 2 --val-output v.bin

echo "$pass passed, $failed failed"
[ $failed -eq 0 ]
