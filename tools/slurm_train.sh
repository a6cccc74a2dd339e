#!/usr/bin/env bash
# Train on a Slurm cluster, one task per GPU.
# Usage: bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [opts]
# Env: GPUS (8), GPUS_PER_NODE (8; 0 requests no GPUs), CPUS_PER_TASK (5),
#      SRUN_ARGS (extra srun options), PORT (29500, the master port).
set -euo pipefail

if [[ $# -lt 4 ]]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4

GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
read -r -a EXTRA_SRUN <<< "${SRUN_ARGS:-}"
# One task per GPU; with GPUS_PER_NODE=0 (CPU nodes) Slurm places the tasks.
PER_NODE=()
if [[ ${GPUS_PER_NODE} -gt 0 ]]; then
    PER_NODE=(--gres="gpu:${GPUS_PER_NODE}"
              --ntasks-per-node="${GPUS_PER_NODE}")
fi
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Read by the slurm launcher on every task to find the rendezvous port.
export MASTER_PORT=${MASTER_PORT:-${PORT:-29500}}
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"

srun -p "${PARTITION}" \
    --job-name="${JOB_NAME}" \
    --ntasks="${GPUS}" \
    "${PER_NODE[@]}" \
    --cpus-per-task="${CPUS_PER_TASK}" \
    --kill-on-bad-exit=1 \
    "${EXTRA_SRUN[@]}" \
    python -u "${REPO_ROOT}/tools/train.py" "${CONFIG}" \
    --work-dir="${WORK_DIR}" --launcher=slurm "$@"
