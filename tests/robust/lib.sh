# lib.sh - shared by the tests/robust/*.sh scripts (sourced): arguments, a scratch directory, and
# the check helpers. Every script is run as
#   SCRIPT PTC PTC_TOKENIZE SOURCE_DIR
# prints one line per case, PASS or FAIL, ends with "N passed, M failed" and exits 0 when nothing
# failed, 1 otherwise. A case that crashes (killed by a signal) or hangs (killed by `timeout`)
# fails like any other.
set -u -o pipefail

ptc=${1:?usage: $0 PTC PTC_TOKENIZE SOURCE_DIR}
tokenize=${2:?usage: $0 PTC PTC_TOKENIZE SOURCE_DIR}
src=${3:?usage: $0 PTC PTC_TOKENIZE SOURCE_DIR}
abs() { case $1 in /*) echo "$1" ;; */*) echo "$PWD/$1" ;; *) command -v "$1" || echo "$1" ;; esac; }
ptc=$(abs "$ptc") tokenize=$(abs "$tokenize") src=$(cd "$src" && pwd) || exit 2
python=$(command -v python3 || echo /usr/bin/python3)

start=$PWD # where the script was started (for relative paths given in the environment)
work=$(mktemp -d "${TMPDIR:-/tmp}/ptc-robust.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
cd "$work" || exit 1

pass=0 failed=0
limit=${PTC_ROBUST_TIMEOUT:-60} # seconds any one command may take before it counts as a hang

# check NAME WANT_RC REGEX CMD...: runs CMD (stdin from /dev/null, at most $limit seconds);
# passes when it exits WANT_RC and its stderr matches the extended regular expression REGEX
# ("" for any stderr). stdout is left in out.txt, stderr in err.txt.
check() {
  local name=$1 want=$2 re=$3
  shift 3
  timeout -k 5 "$limit" "$@" > out.txt 2> err.txt < /dev/null
  local rc=$?
  local msg
  msg=$(grep -v '^(see .* --help)$' err.txt | head -n 4 | cut -c 1-300 | tr '\n' '|' | sed 's/|$//')
  if [ $rc -eq "$want" ] && { [ -z "$re" ] || grep -Eq -- "$re" err.txt; }; then
    pass=$((pass + 1))
    echo "PASS $name: exit $rc: $msg"
  else
    failed=$((failed + 1))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      echo "FAIL $name: still running after $limit s (a hang); stderr: ${msg:-(empty)}"
    elif [ $rc -ne "$want" ]; then
      echo "FAIL $name: exit $rc, expected $want; stderr: ${msg:-(empty)}"
    else
      echo "FAIL $name: exit $rc as expected, but stderr does not match /$re/: ${msg:-(empty)}"
    fi
    [ $rc -lt 128 ] || [ $rc -eq 137 ] || echo "     (killed by signal $((rc - 128)): a crash)"
  fi
}
# ok NAME WHAT: records a passing check made by the caller; bad NAME WHY: a failing one.
ok() { pass=$((pass + 1)); echo "PASS $1: $2"; }
bad() { failed=$((failed + 1)); echo "FAIL $1: $2"; }

# seconds CMD...: runs CMD (output discarded, at most $limit s) and prints the wall time in
# seconds with 2 decimals; the exit status is CMD's.
seconds() {
  local t0 t1 rc
  t0=$(date +%s%N)
  timeout -k 5 "$limit" "$@" > /dev/null 2> err.txt < /dev/null
  rc=$?
  t1=$(date +%s%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f\n", (b - a) / 1e9 }'
  return $rc
}

finish() {
  echo "$pass passed, $failed failed"
  [ $failed -eq 0 ]
}

# make_exe: compiles examples/gpt2_tiny.ptm to ./gpt2_tiny and tokenizes 20 kB of the corpus to
# train.bin; exits the script (after reporting) when that fails.
make_exe() {
  exe=$work/gpt2_tiny
  head -c 20000 "$src/examples/data/corpus.txt" > slice.txt
  if ! "$ptc" "$src/examples/gpt2_tiny.ptm" -o "$exe" > setup.out 2>&1 ||
    ! "$tokenize" slice.txt -o train.bin >> setup.out 2>&1; then
    bad "setup" "could not build gpt2_tiny or train.bin: $(head -c 300 setup.out)"
    finish
    exit
  fi
}

# is_fifo PATH / is_chardev PATH / is_regular PATH, for checks that a target kept its kind.
is_fifo() { [ -p "$1" ] && [ ! -L "$1" ]; }
is_chardev() { [ -c "$1" ] && [ ! -L "$1" ]; }

# read_fifo FIFO OUT: a reader for FIFO in the background, copying what it gets to OUT; its pid
# is in $reader. stop_reader: ends it (it is a cat that would otherwise wait forever).
read_fifo() { cat "$1" > "$2" & reader=$!; }
stop_reader() { kill "$reader" 2> /dev/null; wait "$reader" 2> /dev/null; }

# device NAME MAJOR MINOR: makes a character device node in the scratch directory (a copy of
# /dev/null is c 1 3, of /dev/full c 1 7), so that a test never writes at the system's own nodes
# (which a broken build could replace). Fails without the privilege to make device nodes.
device() { mknod "$1" c "$2" "$3" 2> /dev/null; }

# no_asan BINARY: true when BINARY is not built with AddressSanitizer (which cannot run under a
# memory limit).
no_asan() { ! grep -q __asan_init "$1" 2> /dev/null; }
