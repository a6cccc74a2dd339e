"""SIGKILL after a checkpoint, ``--resume``, and the losses equal the uninterrupted run's.

Seeded, deterministic CPU training of the demo configs with stochastic depth (drop_path_rate 0.1
in both), dropout (the FPN head) and random augmentation on. The killed run is longer than the
reference so that it is still training when the kill comes; the schedules of the demo configs do
not depend on ``train_cfg.max_iters``.
"""
import glob
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
from mmengine.runner.checkpoint import _load_checkpoint

from mmeffvit.datasets import generate_shapes

pytestmark = pytest.mark.e2e
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = 'configs/demo/fpn_flatten_pvt_t_80k_shapes.py'
DET_CFG = 'configs/demo/mask_rcnn_flatten_pvt_t_1x_shapes.py'
SEEDED = ['randomness.seed=0', 'randomness.deterministic=True', 'train_cfg.val_interval=1000',
          'default_hooks.checkpoint.interval=2', 'default_hooks.logger.interval=1']


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes')
    generate_shapes(str(root), num_train=8, num_val=2, min_size=96, max_size=150)
    return root


def seg_options(root, workers=0):
    ade = f'{root}/ade/ADEChallengeData2016'
    return [f'train_dataloader.dataset.data_root={ade}', f'val_dataloader.dataset.data_root={ade}',
            'train_dataloader.batch_size=2', 'model.data_preprocessor.size=(128,128)',
            'train_dataloader.dataset.pipeline.3.crop_size=(128,128)',
            f'train_dataloader.num_workers={workers}'] + SEEDED


def det_options(root):
    coco = f'{root}/coco/'
    small = '(128,128)'
    return [f'train_dataloader.dataset.data_root={coco}',
            f'val_dataloader.dataset.data_root={coco}',
            f'val_evaluator.ann_file={coco}annotations/instances_val2017.json',
            f'train_dataloader.dataset.pipeline.2.scale={small}'] + SEEDED


def _env():
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
                OMP_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='')


def train(config, work_dir, options, iters, *extra):
    cmd = [sys.executable, 'tools/train.py', config, '--work-dir', str(work_dir), *extra,
           '--cfg-options', f'train_cfg.max_iters={iters}', *options]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    return out


def train_and_kill(config, work_dir, options):
    """Start a long run; SIGKILL it once its first checkpoint is complete."""
    cmd = [sys.executable, 'tools/train.py', config, '--work-dir', str(work_dir), '--cfg-options',
           'train_cfg.max_iters=1000', *options]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    pointer = osp.join(work_dir, 'last_checkpoint')  # written after the checkpoint file
    deadline = time.time() + 600
    while not osp.exists(pointer) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert osp.exists(pointer), 'the killed run never wrote a checkpoint'
    with open(pointer) as f:
        return f.read().strip()


def losses(work_dir):
    """The loss terms the newest run in ``work_dir`` logged, by iteration, at full precision."""
    path = sorted(glob.glob(osp.join(work_dir, '2*', 'vis_data', 'scalars.json')))[-1]
    found = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if 'loss' in record:
                found[record['iter']] = {k: v for k, v in record.items() if 'loss' in k}
    return found


def check_exact_resume(config, options, tmp_path, iters=4):
    train(config, tmp_path / 'ref', options, iters)
    reference = losses(tmp_path / 'ref')
    work = tmp_path / 'killed'
    killed_at = train_and_kill(config, str(work), options)
    assert killed_at.endswith('iter_2.pth'), killed_at
    # through mmengine's loader, which importing mmeffvit restricts to what the runner writes
    state = _load_checkpoint(killed_at, map_location='cpu')['resume_state']
    assert len(state['rng']) == 1 and state['sampler']['seed'] == 0
    out = train(config, work, options, iters, '--resume')
    assert 'resumed epoch: 0, iter: 2' in out, out[-3000:]
    assert 'random generator states restored' in out
    resumed = losses(work)
    assert set(resumed) == {3, 4} and set(reference) == set(range(1, iters + 1))
    for it in (3, 4):
        assert resumed[it] == reference[it], (it, resumed[it], reference[it])
    return reference


def test_seg_fpn_resume_is_exact(shapes, tmp_path):
    reference = check_exact_resume(SEG_CFG, seg_options(shapes), tmp_path)
    assert 'decode.loss_ce' in reference[3]


@pytest.mark.slow
def test_seg_fpn_resume_is_exact_with_workers(shapes, tmp_path):
    # workers draw from their own generators, reseeded by mmengine's worker_init_fn; the skip
    # on resume replays their draws
    check_exact_resume(SEG_CFG, seg_options(shapes, workers=2), tmp_path)


@pytest.mark.slow
def test_det_mask_rcnn_resume_is_exact(shapes, tmp_path):
    reference = check_exact_resume(DET_CFG, det_options(shapes), tmp_path)
    assert 'loss_mask' in reference[3]
