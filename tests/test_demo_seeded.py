"""``python tools/demo.py`` is seeded: two runs print the same metrics (CPU)."""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # two demo runs: minutes
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _demo(data_root, work_dir, seed=0):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='')
    cmd = [sys.executable, 'tools/demo.py', '--task', 'seg', '--iters', '3', '--num-train', '4',
           '--num-val', '2', '--data-root', str(data_root), '--work-dir', str(work_dir),
           '--seed', str(seed)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    printed = proc.stdout.split('==== mmeffvit demo')[1]
    with open(osp.join(work_dir, 'summary.json')) as f:
        return json.load(f)[0]['metrics'], [line for line in printed.splitlines() if ': ' in line
                                            and line.strip().startswith(('mIoU', 'mAcc', 'aAcc'))]


def test_two_demo_runs_print_the_same_metrics(tmp_path):
    first, printed_first = _demo(tmp_path / 'data', tmp_path / 'a')
    second, printed_second = _demo(tmp_path / 'data', tmp_path / 'b')
    assert first == second and printed_first == printed_second and len(printed_first) == 3
    assert all(value is not None for value in first.values())
