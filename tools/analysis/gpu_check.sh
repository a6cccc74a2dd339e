#!/usr/bin/env bash
# GPU check of mmeffvit's operators, for a machine with an NVIDIA GPU (prepared for an H200):
# builds the CUDA extension in place, runs the CUDA tests and the operator benchmark in fp32 and
# bf16, then the backbone benchmark (tools/analysis/benchmark.py: every family next to mmdet's
# softmax peers, fp32, then bf16 autocast, then the fp32 resolution sweep, each while the time
# budget lasts), and writes the results to $OUT (default ./gpu_results): results.md,
# benchmarks_*.md, benchmarks_*/ (PNG plots, results.json) and the logs.
#
#   OUT=/some/dir bash tools/analysis/gpu_check.sh
#   GPU_CHECK_BUDGET=1200 BENCH_ROUNDS=3 BENCH_ARGS="--compile" bash tools/analysis/gpu_check.sh
#
# A lent machine without OpenMMLab packages or network: run tools/analysis/gpu_prepare.sh here
# first and carry .devpkgs; this script installs from it when mmengine/mmdet do not import.
# GPU_CHECK_BUDGET (seconds, default 540: one call of a lent machine is limited to 600) bounds
# the whole run: a part that would not fit is skipped, a part that overruns is stopped, and
# results.md always comes back.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-gpu_results}
mkdir -p "$out"
py=${PYTHON:-python}
command -v "$py" >/dev/null || py=python3
t0=$(date +%s)
deadline=$(( t0 + ${GPU_CHECK_BUDGET:-540} ))
left() { echo $(( deadline - $(date +%s) )); }
# run_part NAME MIN_SECONDS CMD...: runs CMD if MIN_SECONDS are left, stopped at the deadline
run_part() {
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then
    echo "$name: skipped, $(left) s of the budget left (needs ~$need)" | tee -a "$out/results.md"
    return 124
  fi
  local start=$(date +%s)
  timeout "$(left)" "$@"
  local rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$out/results.md"
  return $rc
}

if ! "$py" -c 'import mmengine, mmdet, mmseg, mmpretrain' 2>/dev/null; then
  if [ -d .devpkgs/wheels ]; then  # carried wheels (tools/analysis/gpu_prepare.sh)
    "$py" -m pip install -q --no-index --no-deps --target /tmp/mmeffvit_devpkgs \
      .devpkgs/wheels/*.whl >"$out/devpkgs.log" 2>&1
    export PYTHONPATH=/tmp/mmeffvit_devpkgs:$PWD/.devpkgs/py:$PWD${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "mmengine/mmdet/mmseg/mmpretrain missing and no .devpkgs: the backbone benchmark" \
      "will fail (run tools/analysis/gpu_prepare.sh where packages can be downloaded)" >&2
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

arch=$("$py" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
{
  echo "# mmeffvit ops on $("$py" -c 'import torch; print(torch.cuda.get_device_name())')"
  echo "torch $("$py" -c 'import torch; print(torch.__version__)'), arch $arch, $(date -u)"
} >"$out/results.md"
FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch} MAX_JOBS=${MAX_JOBS:-16} \
  run_part build 60 "$py" setup.py build_ext --inplace >"$out/build.log" 2>&1
"$py" -c 'import mmeffvit.ops as o; assert o.load_ext().compiled_with_cuda()' \
  || { echo "CUDA ops not built, see build.log" | tee -a "$out/results.md"; exit 1; }
# -v and faulthandler: a crash in a compiled op names the test and the Python line
run_part tests 30 "$py" -X faulthandler -m pytest tests/test_ops.py -v -p no:cacheprovider \
  >"$out/tests.log" 2>&1
grep -E "passed|failed|Fatal Python error|Segmentation" "$out/tests.log" | tail -n 3 \
  >>"$out/results.md"
for dtype in float32 bfloat16; do
  echo -e "\n## $dtype (goal: op >= 2x faster than the composite)\n" >>"$out/results.md"
  run_part "ops $dtype" 40 "$py" tools/analysis/benchmark_ops.py --device cuda --dtype "$dtype" \
    --reps 20 --backbone-reps 10 2>"$out/bench_$dtype.err" >"$out/ops_$dtype.md"
  cat "$out/ops_$dtype.md" >>"$out/results.md"
done
# backbones: one child per backbone and round (CUDA peaks from max_memory_allocated); about
# 9 s a child on the H200 (spawn, imports, CUDA start): 26 children a round at 800x1333
bench() {  # bench NAME MIN_SECONDS ARGS...
  local name=$1 need=$2; shift 2
  run_part "backbone benchmark $name" "$need" "$py" tools/analysis/benchmark.py --device cuda \
    --out "$out/benchmarks_$name.md" "$@" ${BENCH_ARGS:-} >/dev/null 2>"$out/benchmark_$name.log"
  [ -f "$out/benchmarks_$name.md" ] && sed -n '/^## [0-9]/,$p' "$out/benchmarks_$name.md" \
    >>"$out/results.md"
}
bench fp32 250 --dtype fp32 --rounds "${BENCH_ROUNDS:-1}" --sweep none --no-macs
bench bf16 250 --dtype bf16 --rounds "${BENCH_ROUNDS:-1}" --sweep none --no-macs
bench fp32_sweep 900 --dtype fp32 --rounds 1 --sweep-rounds 1 --no-macs
cat "$out/results.md"
