# Shared by tools/analysis/gpu_check.sh and gpu_profile.sh (sourced, not run): the results folder,
# a time budget that every part runs within, the carried packages, the report's header.
#   GPU_CHECK_BUDGET: seconds for the whole script (default 330: two scripts and a machine start
#   fit a lent GPU's 15 minutes); a part that would not fit is skipped, one that overruns is
#   stopped, and results.md always comes back.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-gpu_results}
mkdir -p "$out"
py=${PYTHON:-python}
command -v "$py" >/dev/null || py=python3
deadline=$(( $(date +%s) + ${GPU_CHECK_BUDGET:-330} ))
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
    echo "mmengine/mmdet/mmseg/mmpretrain missing and no .devpkgs: the benchmarks will fail" \
      "(run tools/analysis/gpu_prepare.sh where packages can be downloaded)" >&2
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# header: the GPU, torch, the commit
header() {
  {
    echo "# $1 on $("$py" -c 'import torch; print(torch.cuda.get_device_name())')"
    echo "torch $("$py" -c 'import torch; print(torch.__version__)'), commit" \
      "$(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u)"
  } >"$out/results.md"
}
# bench NAME MIN_SECONDS ARGS...: tools/analysis/benchmark.py on CUDA, the report's tables
# appended to results.md
bench() {
  local name=$1 need=$2; shift 2
  run_part "backbone benchmark $name" "$need" "$py" tools/analysis/benchmark.py --device cuda \
    --out "$out/benchmarks_$name.md" "$@" ${BENCH_ARGS:-} >/dev/null 2>"$out/benchmark_$name.log"
  [ -f "$out/benchmarks_$name.md" ] && sed -n '/^## [0-9]/,$p' "$out/benchmarks_$name.md" \
    >>"$out/results.md"
}
