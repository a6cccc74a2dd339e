"""Helpers of the end-to-end tests: the demo configs on a small copy of the shapes data, trained
through ``tools/train.py`` in subprocesses. ``conftest.py`` trains the Mask R-CNN and Semantic FPN
runs once per session (fixtures ``e2e_shapes``, ``det_run``, ``seg_run``) for every test module
that needs a real runner checkpoint."""
import glob
import json
import os
import os.path as osp
import shutil
import subprocess
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CFG = 'configs/demo/mask_rcnn_flatten_pvt_t_1x_shapes.py'
SEG_CFG = 'configs/demo/fpn_flatten_pvt_t_80k_shapes.py'


def run(args, timeout=900, env=None):
    """Run ``args`` from the repository root; fail with the output's tail unless it succeeds."""
    full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
                    OMP_NUM_THREADS='1', **(env or {}))
    proc = subprocess.run(args, cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'{" ".join(args)} failed:\n{out[-6000:]}'
    return out


def last_metrics(work_dir):
    """The last record of the newest json log mmengine wrote in ``work_dir``."""
    logs = sorted(glob.glob(osp.join(work_dir, '2*', '2*.json')), key=osp.getmtime)
    assert logs, f'no json log in {work_dir}'
    with open(logs[-1]) as f:
        return [json.loads(line) for line in f if line.strip()][-1]


def det_options(root, iters):
    coco = f'{root}/coco/'
    ann = coco + 'annotations/instances_val2017.json'
    small = '(160,160)'
    return [f'train_dataloader.dataset.data_root={coco}',
            f'val_dataloader.dataset.data_root={coco}', f'test_dataloader.dataset.data_root={coco}',
            f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}',
            f'train_dataloader.dataset.pipeline.2.scale={small}',
            f'test_dataloader.dataset.pipeline.1.scale={small}',
            f'val_dataloader.dataset.pipeline.1.scale={small}',
            f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
            'default_hooks.checkpoint.interval=2', 'default_hooks.logger.interval=1']


def seg_options(root, iters):
    ade = f'{root}/ade/ADEChallengeData2016'
    return [f'train_dataloader.dataset.data_root={ade}', f'val_dataloader.dataset.data_root={ade}',
            f'test_dataloader.dataset.data_root={ade}', 'train_dataloader.batch_size=2',
            'crop_size=(128,128)', 'model.data_preprocessor.size=(128,128)',
            'train_dataloader.dataset.pipeline.3.crop_size=(128,128)',
            f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
            'default_hooks.checkpoint.interval=2', 'default_hooks.logger.interval=1']


def train_run(config, work_dir, options):
    """Train ``config`` into ``work_dir`` (checkpoint and validation at the last iteration)."""
    return run([sys.executable, 'tools/train.py', config, '--work-dir', str(work_dir),
                '--cfg-options'] + options)


def copy_run(work_dir, dest):
    """A private copy of a shared run to write into; its ``last_checkpoint`` points at the copy's
    own checkpoint, so that ``--resume`` without a path reads the copy."""
    shutil.copytree(work_dir, dest)
    pointer = osp.join(dest, 'last_checkpoint')
    with open(pointer) as f:
        name = osp.basename(f.read().strip())
    with open(pointer, 'w') as f:
        f.write(osp.join(str(dest), name))
    return str(dest)
