#!/usr/bin/env bash
# Compile mmeffvit's CUDA operators (FORCE_CUDA=1) into a temporary directory, so that a CUDA
# compile error fails CI on machines without a GPU. The in-tree (CPU) build is left untouched.
#
#   bash tools/check_cuda_build.sh          # TORCH_CUDA_ARCH_LIST defaults to 9.0
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python}
# the toolkit of the nvcc on PATH, as nvcc reports it (it may be a wrapper script elsewhere):
# torch would otherwise guess CUDA_HOME from nvcc's directory and miss libcudart
if [ -z "${CUDA_HOME:-}" ]; then
  top=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)
  CUDA_HOME=$(cd "${top:-$(dirname "$(command -v nvcc)")/..}" && pwd -P)
fi
export CUDA_HOME
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
(cd "$here" && FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
  MAX_JOBS=${MAX_JOBS:-$(nproc)} "$py" setup.py build_ext --build-temp "$tmp/temp" \
  --build-lib "$tmp/lib" >"$tmp/log" 2>&1) || { cat "$tmp/log"; echo "CUDA build FAILED"; exit 1; }
so=$(find "$tmp/lib" -name '_ext*.so' | head -n1)
[ -n "$so" ] || { cat "$tmp/log"; echo "CUDA build produced no _ext*.so"; exit 1; }
# the CUDA kernels must be in the library (no grep -q: it would SIGPIPE nm under pipefail)
nm -C "$so" | grep 'focus_forward_cuda' >/dev/null || { echo "no CUDA symbols in $so"; exit 1; }
echo "CUDA build ok in $(( $(date +%s) - start )) s ($so)"
