"""Crafted and wrong checkpoints through the command-line tools, in subprocesses (issue 11).

``tools/test.py``, ``tools/train.py --resume`` / ``load_from`` and mmseg's own test script refuse
crafted files without running them and stop on checkpoints of another model; a partial match
evaluates. The Semantic FPN demo config on a tiny copy of the shapes data; the files are built
in process (no training needed). The invocations of the tools run in one driver process
(``cli_driver.py``), mmseg's own script in a process of its own. Real runner checkpoints resuming
and evaluating are covered by ``test_e2e_cli.py``.
"""
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from mmeffvit.datasets import generate_shapes

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from cli_driver import run_jobs  # noqa: E402
from crafted_checkpoints import build_segmentor, payloads, runner_checkpoint, save  # noqa: E402

pytestmark = pytest.mark.e2e
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = 'configs/demo/fpn_flatten_pvt_t_80k_shapes.py'


def _env():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
               OMP_NUM_THREADS='1')
    env.pop('MMEFFVIT_TRUST_CHECKPOINTS', None)
    return env


def run(args, expect_ok):
    proc = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == expect_ok, f'{" ".join(args)} rc={proc.returncode}:\n' \
        f'{out[-4000:]}'
    return out


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes')
    generate_shapes(str(root), num_train=2, num_val=1, min_size=64, max_size=96)
    ade = f'{root}/ade/ADEChallengeData2016'
    return [f'{split}_dataloader.dataset.data_root={ade}' for split in ('train', 'val', 'test')] \
        + ['train_dataloader.batch_size=1', 'crop_size=(64,64)',
           'model.data_preprocessor.size=(64,64)',
           'train_dataloader.dataset.pipeline.3.crop_size=(64,64)', 'train_cfg.max_iters=1',
           'train_cfg.val_interval=1']


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('files')
    swin, _ = build_segmentor(dict(type='FLattenSwin', arch='tiny', init_cfg=None),
                              [96, 192, 384, 768])
    pvt, _ = build_segmentor()
    paths = dict(swin=str(root / 'swin_fpn.pth'), pvt=str(root / 'pvt_fpn.pth'),
                 nomatch=str(root / 'nomatch.pth'), marker=root / 'marker')
    torch.save({'state_dict': swin.state_dict()}, paths['swin'])
    torch.save({'state_dict': pvt.state_dict()}, paths['pvt'])
    torch.save({'state_dict': {'foo.weight': torch.ones(3)}}, paths['nomatch'])
    evil = payloads(paths['marker'])
    for name, place in (('getattr_exec', 'message_hub'), ('reduce_posix_system', 'meta')):
        ckpt = runner_checkpoint(evil[name], place)
        ckpt['state_dict'] = pvt.state_dict()
        paths[name] = save(ckpt, root / f'{name}.pth')
    return paths


@pytest.fixture(scope='module')
def cli(data, files, tmp_path_factory):
    """The cases below that test independent messages of tools/test.py and tools/train.py, run
    one after another in one driver process (cli_driver.py; the imports paid once):
    ``{case: (returncode, output)}``."""
    tmp = tmp_path_factory.mktemp('cli')
    test = ['tools/test.py', SEG_CFG]
    cases = {
        'test_crafted': test + [files['getattr_exec'], '--work-dir', str(tmp / 'a'),
                                '--cfg-options'] + data,
        'resume_crafted': ['tools/train.py', SEG_CFG, '--work-dir', str(tmp / 'b'), '--resume',
                           files['reduce_posix_system'], '--cfg-options'] + data,
        'test_nomatch': test + [files['nomatch'], '--work-dir', str(tmp / 'c'),
                                '--cfg-options'] + data,
        'test_swin': test + [files['swin'], '--work-dir', str(tmp / 'd'), '--cfg-options'] + data,
        'load_from_swin': ['tools/train.py', SEG_CFG, '--work-dir', str(tmp / 'e'),
                           '--cfg-options', f'load_from={files["swin"]}'] + data,
        'test_partial': test + [files['pvt'], '--work-dir', str(tmp / 'f'), '--cfg-options',
                                'model.decode_head.num_classes=4'] + data,
    }
    return run_jobs({name: dict(argv=argv) for name, argv in cases.items()}, tmp, _env())


def check(result, expect_ok):
    returncode, out = result
    assert (returncode == 0) == expect_ok, f'rc={returncode}:\n{out[-4000:]}'
    return out


def test_test_tool_refuses_crafted_file(cli, files):
    out = check(cli['test_crafted'], expect_ok=False)
    assert 'UnsafeCheckpointError' in out and "getattr(HistoryBuffer, '__init__')" in out
    assert not files['marker'].exists()


def test_resume_refuses_crafted_file(cli, files):
    out = check(cli['resume_crafted'], expect_ok=False)
    assert 'UnsafeCheckpointError' in out and "'posix.system'" in out
    assert not files['marker'].exists()


def test_mmsegs_own_test_script_refuses_crafted_file(data, files, tmp_path):
    """A subprocess of its own: the config's custom_imports alone must bring in mmeffvit."""
    import mmseg
    script = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', 'test.py')
    out = run([sys.executable, script, SEG_CFG, files['getattr_exec'], '--work-dir',
               str(tmp_path), '--cfg-options'] + data, expect_ok=False)
    assert 'UnsafeCheckpointError' in out
    assert not files['marker'].exists()


@pytest.mark.parametrize('name,expected', [
    ('nomatch', '0 of its 217 tensors would load'),
    ('swin', 'the file is a FLatten-Swin-T checkpoint; the config builds FLatten-PVT-T')])
def test_test_tool_stops_on_wrong_checkpoint(cli, name, expected):
    out = check(cli[f'test_{name}'], expect_ok=False)
    assert 'CheckpointMismatchError' in out and expected in out
    assert 'Iter(test)' not in out


def test_load_from_stops_on_wrong_checkpoint(cli):
    out = check(cli['load_from_swin'], expect_ok=False)
    assert 'FLatten-Swin-T checkpoint; the config builds FLatten-PVT-T' in out
    assert 'Iter(train)' not in out


def test_test_tool_evaluates_partial_match(cli):
    """Another number of classes: the classifier is not loaded, the rest is; evaluation runs."""
    out = check(cli['test_partial'], expect_ok=True)
    assert '215 of 217 tensors loaded' in out and 'mIoU' in out
