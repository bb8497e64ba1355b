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
