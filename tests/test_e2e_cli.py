"""End to end through the command-line tools, in subprocesses, on a small copy of the shapes data.

Mask R-CNN (mmdet) and Semantic FPN (mmseg) with FLatten-PVT-T, trained once per session by
``conftest.py`` (``det_run``, ``seg_run``): evaluate the checkpoint with ``tools/test.py`` and with
the toolboxes' own test entries, resume, and train with two processes through
``tools/dist_train.sh``. The shared runs are read only; each test writes into its own directory.
"""
import glob
import os.path as osp
import socket
import sys

import pytest

from e2e_runs import DET_CFG, SEG_CFG, copy_run, det_options, last_metrics, run, seg_options

pytestmark = pytest.mark.e2e


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return str(s.getsockname()[1])


def test_det_test_computes_coco_bbox_and_segm(det_run, e2e_shapes, tmp_path):
    out = run([sys.executable, 'tools/test.py', DET_CFG, osp.join(det_run, 'iter_2.pth'),
               '--work-dir', str(tmp_path), '--cfg-options'] + det_options(e2e_shapes, 2))
    metrics = last_metrics(str(tmp_path))
    assert 'coco/bbox_mAP' in metrics and 'coco/segm_mAP' in metrics, out[-3000:]
    assert 0.0 <= metrics['coco/bbox_mAP'] <= 1.0


def test_det_resume_continues(det_run, e2e_shapes, tmp_path):
    work = copy_run(det_run, tmp_path / 'det')  # --resume alone: the work dir's last checkpoint
    out = run([sys.executable, 'tools/train.py', DET_CFG, '--work-dir', work, '--resume',
               '--cfg-options'] + det_options(e2e_shapes, 3))
    assert 'resumed epoch: 0, iter: 2' in out and osp.join(work, 'iter_2.pth') in out
    assert 'Iter(train) [3/3]' in out and 'Iter(train) [1/3]' not in out
    assert osp.isfile(osp.join(work, 'iter_3.pth'))


def test_det_checkpoint_in_mmdets_own_test_script(det_run, e2e_shapes, tmp_path):
    import mmdet
    script = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'test.py')
    work = str(tmp_path / 'own_tool')
    run([sys.executable, script, DET_CFG, osp.join(det_run, 'iter_2.pth'), '--work-dir', work,
         '--cfg-options'] + det_options(e2e_shapes, 2))
    assert 'coco/segm_mAP' in last_metrics(work)


def test_det_checkpoint_with_mim_test(det_run, e2e_shapes, tmp_path):
    work = str(tmp_path / 'mim')
    run([sys.executable, '-m', 'mim', 'test', 'mmdet', DET_CFG, '--checkpoint',
         osp.join(det_run, 'iter_2.pth'), '--work-dir', work, '--cfg-options']
        + det_options(e2e_shapes, 2))
    assert 'coco/bbox_mAP' in last_metrics(work)


def test_seg_test_and_resume(seg_run, e2e_shapes, tmp_path):
    work = str(tmp_path / 'seg')
    run([sys.executable, 'tools/test.py', SEG_CFG, osp.join(seg_run, 'iter_2.pth'),
         '--work-dir', work, '--show-dir', 'shown', '--cfg-options']
        + seg_options(e2e_shapes, 2))
    metrics = last_metrics(work)
    assert 0.0 <= metrics['mIoU'] <= 100.0
    # every val image drawn, under the work dir (not the current directory)
    drawn = glob.glob(osp.join(work, 'shown', 'vis_data', 'vis_image', '*.png'))
    assert len(drawn) == 3, drawn  # num_val of the shapes fixture
    out = run([sys.executable, 'tools/train.py', SEG_CFG, '--work-dir', work, '--resume',
               osp.join(seg_run, 'iter_2.pth'), '--cfg-options'] + seg_options(e2e_shapes, 3))
    assert 'resumed epoch: 0, iter: 2' in out and 'Iter(train) [3/3]' in out


def test_seg_checkpoint_in_mmsegs_own_test_script(seg_run, e2e_shapes, tmp_path):
    import mmseg
    script = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', 'test.py')
    work = str(tmp_path / 'own_tool')
    run([sys.executable, script, SEG_CFG, osp.join(seg_run, 'iter_2.pth'), '--work-dir', work,
         '--cfg-options'] + seg_options(e2e_shapes, 2))
    assert 'mIoU' in last_metrics(work)


@pytest.mark.slow  # 60 s; dist_train.sh's two gloo ranks: test_tools_cli, test_dist_cpu
def test_two_process_distributed_training(e2e_shapes, tmp_path):
    work = str(tmp_path / 'dist')
    out = run(['bash', 'tools/dist_train.sh', DET_CFG, '2', '--work-dir', work, '--cfg-options']
              + det_options(e2e_shapes, 2), env=dict(PORT=free_port()))
    # mmengine's environment report: two ranks joined one gloo group
    for line in ('Distributed launcher: pytorch', 'Distributed training: True', 'GPU number: 2',
                 "'backend': 'gloo'"):
        assert line in out, line
    assert osp.isfile(osp.join(work, 'iter_2.pth'))
