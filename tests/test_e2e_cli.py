"""End to end through the command-line tools, in subprocesses, on a small copy of the shapes data.

Mask R-CNN (mmdet) and Semantic FPN (mmseg) with FLatten-PVT-T: train a few iterations, evaluate
the checkpoint with ``tools/test.py`` and with the toolboxes' own test entries, resume, and train
with two processes through ``tools/dist_train.sh``.
"""
import glob
import json
import os
import os.path as osp
import socket
import subprocess
import sys

import pytest

from mmeffvit.datasets import generate_shapes

pytestmark = pytest.mark.e2e
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CFG = 'configs/demo/mask_rcnn_flatten_pvt_t_1x_shapes.py'
SEG_CFG = 'configs/demo/fpn_flatten_pvt_t_80k_shapes.py'


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return str(s.getsockname()[1])


def run(args, timeout=900, env=None):
    full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
                    OMP_NUM_THREADS='1', **(env or {}))
    proc = subprocess.run(args, cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'{" ".join(args)} failed:\n{out[-6000:]}'
    return out


def last_metrics(work_dir):
    logs = sorted(glob.glob(osp.join(work_dir, '2*', '2*.json')), key=osp.getmtime)
    assert logs, f'no json log in {work_dir}'
    with open(logs[-1]) as f:
        return [json.loads(line) for line in f if line.strip()][-1]


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes')
    generate_shapes(str(root), num_train=8, num_val=3, min_size=96, max_size=150)
    return root


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


@pytest.fixture(scope='module')
def det_run(shapes, tmp_path_factory):
    work = str(tmp_path_factory.mktemp('det'))
    out = run([sys.executable, 'tools/train.py', DET_CFG, '--work-dir', work, '--cfg-options']
              + det_options(shapes, 2))
    assert 'loss_mask' in out and 'Iter(train) [2/2]' in out
    return work


@pytest.fixture(scope='module')
def seg_run(shapes, tmp_path_factory):
    work = str(tmp_path_factory.mktemp('seg'))
    out = run([sys.executable, 'tools/train.py', SEG_CFG, '--work-dir', work, '--cfg-options']
              + seg_options(shapes, 2))
    assert 'decode.loss_ce' in out and 'Iter(train) [2/2]' in out
    return work


def test_det_test_computes_coco_bbox_and_segm(det_run, shapes):
    out = run([sys.executable, 'tools/test.py', DET_CFG, osp.join(det_run, 'iter_2.pth'),
               '--work-dir', det_run, '--cfg-options'] + det_options(shapes, 2))
    metrics = last_metrics(det_run)
    assert 'coco/bbox_mAP' in metrics and 'coco/segm_mAP' in metrics, out[-3000:]
    assert 0.0 <= metrics['coco/bbox_mAP'] <= 1.0


def test_det_resume_continues(det_run, shapes):
    out = run([sys.executable, 'tools/train.py', DET_CFG, '--work-dir', det_run, '--resume',
               '--cfg-options'] + det_options(shapes, 3))
    assert 'resumed epoch: 0, iter: 2' in out
    assert 'Iter(train) [3/3]' in out and 'Iter(train) [1/3]' not in out
    assert osp.isfile(osp.join(det_run, 'iter_3.pth'))


def test_det_checkpoint_in_mmdets_own_test_script(det_run, shapes):
    import mmdet
    script = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'test.py')
    work = osp.join(det_run, 'own_tool')
    run([sys.executable, script, DET_CFG, osp.join(det_run, 'iter_2.pth'), '--work-dir', work,
         '--cfg-options'] + det_options(shapes, 2))
    assert 'coco/segm_mAP' in last_metrics(work)


def test_det_checkpoint_with_mim_test(det_run, shapes):
    work = osp.join(det_run, 'mim')
    run([sys.executable, '-m', 'mim', 'test', 'mmdet', DET_CFG, '--checkpoint',
         osp.join(det_run, 'iter_2.pth'), '--work-dir', work, '--cfg-options']
        + det_options(shapes, 2))
    assert 'coco/bbox_mAP' in last_metrics(work)


def test_seg_test_and_resume(seg_run, shapes):
    run([sys.executable, 'tools/test.py', SEG_CFG, osp.join(seg_run, 'iter_2.pth'),
         '--work-dir', seg_run, '--show-dir', 'shown', '--cfg-options']
        + seg_options(shapes, 2))
    metrics = last_metrics(seg_run)
    assert 0.0 <= metrics['mIoU'] <= 100.0
    # every val image drawn, under the work dir (not the current directory)
    drawn = glob.glob(osp.join(seg_run, 'shown', 'vis_data', 'vis_image', '*.png'))
    assert len(drawn) == 3, drawn  # num_val of the shapes fixture
    out = run([sys.executable, 'tools/train.py', SEG_CFG, '--work-dir', seg_run, '--resume',
               osp.join(seg_run, 'iter_2.pth'), '--cfg-options'] + seg_options(shapes, 3))
    assert 'resumed epoch: 0, iter: 2' in out and 'Iter(train) [3/3]' in out


def test_seg_checkpoint_in_mmsegs_own_test_script(seg_run, shapes):
    import mmseg
    script = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', 'test.py')
    work = osp.join(seg_run, 'own_tool')
    run([sys.executable, script, SEG_CFG, osp.join(seg_run, 'iter_2.pth'), '--work-dir', work,
         '--cfg-options'] + seg_options(shapes, 2))
    assert 'mIoU' in last_metrics(work)


def test_two_process_distributed_training(shapes, tmp_path):
    work = str(tmp_path / 'dist')
    out = run(['bash', 'tools/dist_train.sh', DET_CFG, '2', '--work-dir', work, '--cfg-options']
              + det_options(shapes, 2), env=dict(PORT=free_port()))
    # mmengine's environment report: two ranks joined one gloo group
    for line in ('Distributed launcher: pytorch', 'Distributed training: True', 'GPU number: 2',
                 "'backend': 'gloo'"):
        assert line in out, line
    assert osp.isfile(osp.join(work, 'iter_2.pth'))
