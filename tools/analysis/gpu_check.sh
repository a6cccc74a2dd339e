#!/usr/bin/env bash
# GPU check, script 1 of 2 (then tools/analysis/gpu_profile.sh), for one NVIDIA GPU (prepared
# for an H100 / H200) within GPU_CHECK_BUDGET seconds (default 330, see gpu_common.sh):
#   1. the Triton kernels' tests on CUDA (tests/test_triton_*.py: each op against its float64
#      reference, fp32 / bf16 / fp16, compile, a training step of each family);
#   2. the training table: every family beside mmdet's PVT-T, PVTv2-B0/B1 and Swin-T in one
#      run, the way mmdet trains: batch 2, 800×1333, bf16 autocast, forward, backward and the
#      configs' AdamW step, Triton kernels selected (MMEFFVIT_TRITON=1), one process per case;
#   3. where time is left: the CUDA extension built, its argument-check test alone (a crash there
#      names the C++-exception hypothesis of docs/ops.md), then tests/test_ops.py.
# Results in $OUT (default ./gpu_results): results.md, benchmarks_train_bf16.md, the logs.
#
#   OUT=/some/dir bash tools/analysis/gpu_check.sh
#   GPU_CHECK_BUDGET=1200 BENCH_ROUNDS=3 bash tools/analysis/gpu_check.sh
#
# A machine without OpenMMLab packages or network: run tools/analysis/gpu_prepare.sh here first
# and carry .devpkgs; the script installs from it when mmengine/mmdet do not import.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"
header "mmeffvit GPU check (Triton tests, training table)"
# -v and faulthandler: a crash names the test and the Python line
run_part "Triton tests" 60 "$py" -X faulthandler -m pytest tests/test_triton_flatten.py \
  tests/test_triton_window_attention.py tests/test_triton_linear_attention.py \
  tests/test_triton_query_grid_conv.py tests/test_triton_stripe_attention.py -v \
  -p no:cacheprovider >"$out/triton_tests.log" 2>&1
grep -E "passed|failed|Fatal Python error|Segmentation" "$out/triton_tests.log" | tail -n 3 \
  >>"$out/results.md"
grep -E "^(FAILED|ERROR) " "$out/triton_tests.log" >>"$out/results.md"
MMEFFVIT_TRITON=1 bench train_bf16 150 --dtype bf16 --modes train --batch 2 \
  --optimizer adamw --rounds "${BENCH_ROUNDS:-1}" --sweep none --no-macs
arch=$("$py" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch} MAX_JOBS=${MAX_JOBS:-16} \
  run_part "CUDA extension build" 90 "$py" setup.py build_ext --inplace >"$out/build.log" 2>&1
if "$py" -c 'import mmeffvit.ops as o; assert o.load_ext().compiled_with_cuda()' 2>/dev/null; then
  run_part "argument checks alone" 20 "$py" -X faulthandler -m pytest tests/test_ops.py -v \
    -p no:cacheprovider -k test_compiled_backward_entry_points_check_every_argument \
    >"$out/ops_argcheck.log" 2>&1
  run_part "CUDA op tests" 30 "$py" -X faulthandler -m pytest tests/test_ops.py -v \
    -p no:cacheprovider >"$out/ops_tests.log" 2>&1
  grep -E "passed|failed|Fatal Python error|Segmentation" "$out/ops_argcheck.log" \
    "$out/ops_tests.log" | tail -n 4 >>"$out/results.md"
else
  echo "CUDA ops not built or not tested (see build.log)" >>"$out/results.md"
fi
cat "$out/results.md"
