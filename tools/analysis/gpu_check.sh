#!/usr/bin/env bash
# GPU check of mmeffvit's operators, for a machine with an NVIDIA GPU (prepared for an H200):
# builds the CUDA extension in place, runs the CUDA tests and the operator benchmark in fp32 and
# bf16, then the backbone benchmark (tools/analysis/benchmark.py: every family next to mmdet's
# softmax peers, fp32 with the resolution sweep, then bf16 autocast at 800x1333), and writes the
# results to $OUT (default ./gpu_results): results.md, benchmarks_*.md, benchmarks_*/ (PNG plots,
# results.json) and the logs.
#
#   OUT=/some/dir bash tools/analysis/gpu_check.sh
#   BENCH_DTYPES="fp32" BENCH_ROUNDS=3 BENCH_ARGS="--compile" bash tools/analysis/gpu_check.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-gpu_results}
mkdir -p "$out"
py=${PYTHON:-python}
arch=$("$py" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
{
  echo "# mmeffvit ops on $("$py" -c 'import torch; print(torch.cuda.get_device_name())')"
  echo "torch $("$py" -c 'import torch; print(torch.__version__)'), arch $arch, $(date -u)"
} >"$out/results.md"
start=$(date +%s)
FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch} MAX_JOBS=${MAX_JOBS:-8} \
  "$py" setup.py build_ext --inplace >"$out/build.log" 2>&1
echo "build: rc=$? in $(( $(date +%s) - start )) s" | tee -a "$out/results.md"
"$py" -c 'import mmeffvit.ops as o; assert o.load_ext().compiled_with_cuda()' \
  || { echo "CUDA ops not built, see build.log" | tee -a "$out/results.md"; exit 1; }
"$py" -m pytest tests/test_ops.py -q -p no:cacheprovider >"$out/tests.log" 2>&1
echo "tests: rc=$? ($(tail -n1 "$out/tests.log"))" | tee -a "$out/results.md"
for dtype in float32 bfloat16; do
  echo -e "\n## $dtype (goal: op >= 2x faster than the composite)\n" >>"$out/results.md"
  "$py" tools/analysis/benchmark_ops.py --device cuda --dtype "$dtype" --reps 20 \
    --backbone-reps 10 2>"$out/bench_$dtype.err" | tee -a "$out/results.md"
done
# backbones: one child process per backbone and round (CUDA peaks from max_memory_allocated)
for dtype in ${BENCH_DTYPES:-fp32 bf16}; do
  sweep=()  # the sweep and the GMACs (dtype-independent) only with fp32, to save device time
  [ "$dtype" != fp32 ] && sweep=(--sweep none --no-macs)
  start=$(date +%s)
  "$py" tools/analysis/benchmark.py --device cuda --dtype "$dtype" --rounds "${BENCH_ROUNDS:-2}" \
    "${sweep[@]}" --out "$out/benchmarks_$dtype.md" ${BENCH_ARGS:-} \
    >/dev/null 2>"$out/benchmark_$dtype.log"
  echo "backbone benchmark $dtype: rc=$? in $(( $(date +%s) - start )) s" | tee -a "$out/results.md"
  sed -n '/^## [0-9]/,$p' "$out/benchmarks_$dtype.md" >>"$out/results.md"
done
cat "$out/results.md"
