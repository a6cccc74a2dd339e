#!/usr/bin/env bash
# GPU check, script 2 of 2 (after tools/analysis/gpu_check.sh), within GPU_CHECK_BUDGET seconds
# (default 330, see gpu_common.sh), Triton kernels selected (MMEFFVIT_TRITON=1):
#   1. the inference table in bf16 autocast: every family beside mmdet's peers, batch 2,
#      800×1333, one process per case, CUDA events, max_memory_allocated;
#   2. the kernel profiles (tools/analysis/profile_gpu.py): per backbone the kernels an inference
#      step launches and their time from torch.profiler, the top kernels, and the kernel
#      counter's count beside them (its calibration);
#   3. the inference table in fp32, then the 1536² sweep, where time is left.
# Results in $OUT (default ./gpu_results): results.md, benchmarks_*.md, profiles.md/.json, logs.
#
#   OUT=/some/dir bash tools/analysis/gpu_profile.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"
header "mmeffvit GPU profile (inference tables, kernel profiles)"
export MMEFFVIT_TRITON=1
bench infer_bf16 100 --dtype bf16 --modes infer --batch 2 --rounds "${BENCH_ROUNDS:-1}" \
  --sweep none --no-macs
run_part "kernel profiles" 120 "$py" tools/analysis/profile_gpu.py --device cuda --dtype bf16 \
  --modes infer --batch 2 --out "$out/profiles.md" --json "$out/profiles.json" \
  2>"$out/profiles.log" >/dev/null
[ -f "$out/profiles.md" ] && cat "$out/profiles.md" >>"$out/results.md"
bench infer_fp32 100 --dtype fp32 --modes infer --batch 2 --rounds "${BENCH_ROUNDS:-1}" \
  --sweep none --no-macs
bench sweep_1536 120 --dtype bf16 --modes infer,train --optimizer adamw --batch 2 \
  --shape 1536 --rounds 1 --sweep none --no-macs
cat "$out/results.md"
