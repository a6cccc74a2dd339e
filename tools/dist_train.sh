#!/usr/bin/env bash
# Start tools/train.py on NPROC local processes with torchrun.
# Usage: bash tools/dist_train.sh CONFIG NPROC [train.py options]
# Env: PORT (29500), NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1).
# Without CUDA the processes talk over gloo on the CPU.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 CONFIG NPROC [train.py options]" >&2
    exit 2
fi
CONFIG=$1
NPROC=$2
shift 2

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# A pip-installed torch provides torchrun; fall back to the module otherwise.
if command -v torchrun >/dev/null 2>&1; then
    LAUNCH=(torchrun)
else
    LAUNCH=(python -m torch.distributed.run)
fi

PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" \
"${LAUNCH[@]}" \
    --nnodes="${NNODES:-1}" \
    --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" \
    --nproc_per_node="${NPROC}" \
    --master_port="${PORT:-29500}" \
    "${REPO_ROOT}/tools/train.py" "${CONFIG}" --launcher pytorch "$@"
