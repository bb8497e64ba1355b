#!/usr/bin/env bash
# gpu_bundle.sh [DIR [BASELINE_TOOLS]] - packs what bench/gpu_check.sh needs on a GPU machine that cannot build ptc
# (no flex, bison, LLVM or Criterion there, no network): the ptc and ptc-runner of build/tools,
# stripped, and the shared libraries they link that are not the C and C++ runtimes (libLLVM and
# what it pulls in, Open MPI), into DIR (default .gpu, which .gitignore keeps out of git), with
# DIR/env.sh to source there first:
#
#   bench/gpu_bundle.sh                       # here, after tools/setup.sh built build/
#   source .gpu/env.sh && bash bench/gpu_check.sh         # there, in a copy of the tree
#
# env.sh unpacks only the libraries the machine lacks (a library it has stays its own), puts the
# folders of NVRTC, cuBLASLt and NCCL on the library path, copies the binaries to build/tools
# (where gpu_check.sh looks), and sets PTC_COMMIT (the copy of the tree there has no .git).
# The binaries need a glibc at least as new as this machine's (Debian 12: 2.36).
# BASELINE_TOOLS: the build/tools folder of another build (another commit's worktree, say):
# its ptc and ptc-runner go along too, and env.sh sets GPU_CHECK_BASELINE to them, so that
# gpu_check.sh times both side by side.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/.gpu}
baseline=${2:-}
bin=$root/build/tools
for b in ptc ptc-runner; do
  [ -x "$bin/$b" ] || { echo "gpu_bundle: no $bin/$b (run tools/setup.sh first)" >&2; exit 2; }
done
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib"
strip -o "$dir/bin/ptc" "$bin/ptc"
strip -o "$dir/bin/ptc-runner" "$bin/ptc-runner"
if [ -n "$baseline" ]; then
  mkdir -p "$dir/baseline"
  strip -o "$dir/baseline/ptc" "$baseline/ptc"
  strip -o "$dir/baseline/ptc-runner" "$baseline/ptc-runner"
fi
ldd "$bin/ptc" "$bin/ptc-runner" | awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$dir/lib/"; done
tar -C "$dir/lib" -cf - . | xz -6 -T0 > "$dir/libs.tar.xz"
rm -rf "$dir/lib"
git -C "$root" rev-parse --short HEAD > "$dir/COMMIT" 2>/dev/null || echo unknown > "$dir/COMMIT"
git -C "$root" diff --quiet HEAD 2>/dev/null || sed -i 's/$/+changes/' "$dir/COMMIT"
cat > "$dir/env.sh" <<'EOF'
# source this in the root of the tree's copy on the GPU machine (bench/gpu_bundle.sh made it)
_b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p /tmp/ptc-gpu-lib && tar -C /tmp/ptc-gpu-lib -xJf "$_b/libs.tar.xz"
for _f in /tmp/ptc-gpu-lib/*; do  # the machine's own where it has one
  if ldconfig -p | grep -q "^[[:space:]]$(basename "$_f") ("; then rm -f "$_f"; fi
done
_p=/tmp/ptc-gpu-lib
for _n in libnvrtc.so.13 libcublasLt.so.13 libnccl.so.2; do
  _l=
  for _d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
            /usr/lib/x86_64-linux-gnu; do
    [ -e "$_d/$_n" ] && { _l=$_d/$_n; break; }
  done
  [ -n "$_l" ] || _l=$(find -L /opt /usr/local -name "$_n" 2>/dev/null | head -1)
  if [ -n "$_l" ]; then _p=$_p:$(dirname "$_l"); else echo "gpu env: no $_n found" >&2; fi
done
export LD_LIBRARY_PATH=$_p${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p build/tools && cp "$_b/bin/ptc" "$_b/bin/ptc-runner" build/tools/
export PTC_COMMIT=$(cat "$_b/COMMIT")
[ -x "$_b/baseline/ptc" ] && export GPU_CHECK_BASELINE=$_b/baseline/ptc
if ldd build/tools/ptc | grep -q 'not found'; then
  echo "gpu env: still missing:" >&2; ldd build/tools/ptc | grep 'not found' >&2
fi
unset _b _f _p _n _l _d
EOF
echo "gpu_bundle: $dir ($(du -sh "$dir" | cut -f1)); there: source ${dir#$root/}/env.sh && bash bench/gpu_check.sh"
