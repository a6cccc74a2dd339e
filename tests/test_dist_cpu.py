"""``tools/dist_train.sh`` on two CPU (gloo) processes: SyncBN configs train, a failing rank ends
the run with its own error and leaves no process behind.

The Mask R-CNN demo's two-process run is in test_e2e_cli.py.
"""
import os
import os.path as osp
import socket
import subprocess
import textwrap

import pytest
from mmengine.runner.checkpoint import _load_checkpoint

from mmeffvit.datasets import generate_shapes

pytestmark = pytest.mark.e2e
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return str(sock.getsockname()[1])


@pytest.fixture(scope='module')
def ade(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes')
    generate_shapes(str(root), num_train=4, num_val=2, min_size=64, max_size=96)
    return root / 'ade' / 'ADEChallengeData2016'


def dist_train(config, nproc, *args, extra_path=''):
    env = dict(os.environ, PORT=_free_port(), OMP_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='',
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, extra_path) if p))
    env.pop('LOCAL_RANK', None)
    proc = subprocess.run(['bash', 'tools/dist_train.sh', config, str(nproc), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def seg_options(ade, work_dir):
    return ['--work-dir', str(work_dir), '--cfg-options',
            f'train_dataloader.dataset.data_root={ade}', f'val_dataloader.dataset.data_root={ade}',
            'train_dataloader.batch_size=1', 'model.data_preprocessor.size=(64,64)',
            'train_dataloader.dataset.pipeline.3.crop_size=(64,64)', 'train_cfg.max_iters=2',
            'train_cfg.val_interval=2', 'default_hooks.logger.interval=1']


def _trained(rc, out, work_dir):
    assert rc == 0, out[-5000:]
    assert "'backend': 'gloo'" in out and 'GPU number: 2' in out
    assert 'CPUSyncBNMMDistributedDataParallel' in out  # the SyncBN heads were converted
    assert 'Iter(train) [2/2]' in out and 'mIoU' in out
    # both processes' generator states went into the checkpoint (rank 0 writes it)
    state = _load_checkpoint(osp.join(work_dir, 'iter_2.pth'), map_location='cpu')['resume_state']
    assert state['world_size'] == 2 and len(state['rng']) == 2
    assert all({'python', 'numpy', 'torch'} <= set(rank) for rank in state['rng'])


def test_semantic_fpn_syncbn(ade, tmp_path):
    _trained(*dist_train('configs/demo/fpn_flatten_pvt_t_80k_shapes.py', 2,
                         *seg_options(ade, tmp_path)), tmp_path)


@pytest.mark.slow
def test_upernet_syncbn(ade, tmp_path):
    _trained(*dist_train('configs/demo/upernet_lavit_s_160k_shapes.py', 2,
                         *seg_options(ade, tmp_path)), tmp_path)


CRASH_MODULE = '''
import os
import time

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS
from torch.utils.data import Dataset


@MODELS.register_module()
class CrashToyModel(BaseModel):
    """A conv and a SyncBN, as in the segmentation heads."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 1)
        self.bn = torch.nn.SyncBatchNorm(4)

    def forward(self, inputs, labels=None, mode='tensor'):
        pred = self.bn(self.conv(inputs)).mean(dim=(1, 2, 3))
        return dict(loss=((pred - labels) ** 2).mean()) if mode == 'loss' else pred


@DATASETS.register_module()
class CrashToyDataset(Dataset):

    def __len__(self):
        return 64

    def __getitem__(self, index):
        return dict(inputs=torch.full((2, 3, 3), float(index)), labels=torch.tensor(1.0))


@HOOKS.register_module()
class FailOnRankHook(Hook):

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter == 1 and os.environ['RANK'] == os.environ['FAILING_RANK']:
            raise RuntimeError('rank ' + os.environ['RANK'] + ' fails on purpose')
        if runner.iter == 1:  # the other rank: busy (e.g. loading data) when its peer fails
            time.sleep(float(os.environ['OTHER_RANK_SLEEP']))
'''

CRASH_CONFIG = '''
default_scope = 'mmengine'
custom_imports = dict(imports=['crash_toy'], allow_failed_imports=False)
model = dict(type='CrashToyModel')
train_dataloader = dict(
    batch_size=2, num_workers=1, dataset=dict(type='CrashToyDataset'),
    sampler=dict(type='DefaultSampler', shuffle=True), collate_fn=dict(type='default_collate'))
train_cfg = dict(type='IterBasedTrainLoop', max_iters=9)
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
default_hooks = dict(logger=dict(type='LoggerHook', interval=1))
custom_hooks = [dict(type='FailOnRankHook')]
log_processor = dict(by_epoch=False)
'''


def _processes_mentioning(marker):
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.parametrize('failing_rank,other_rank_sleep', [('1', '0'), ('1', '20')])
def test_a_failing_rank_ends_the_run_with_its_error(tmp_path, monkeypatch, failing_rank,
                                                    other_rank_sleep):
    """The other rank either sees its peer gone in the next collective or is ended by torchrun
    first (0.1 s after the failure; forced by sleeping 20 s): it says why in both cases."""
    (tmp_path / 'crash_toy.py').write_text(textwrap.dedent(CRASH_MODULE))
    config = tmp_path / 'crash_cfg.py'
    config.write_text(textwrap.dedent(CRASH_CONFIG))
    monkeypatch.setenv('FAILING_RANK', failing_rank)
    monkeypatch.setenv('OTHER_RANK_SLEEP', other_rank_sleep)
    rc, out = dist_train(str(config), 2, '--work-dir', str(tmp_path / 'work'),
                         extra_path=str(tmp_path))
    assert rc != 0, out[-4000:]
    assert 'Iter(train) [1/9]' in out  # SyncBN trained before the failure
    # the first failure is the failing rank's own error, with its traceback (not a user error)
    root_cause = out.split('Root Cause (first observed failure):')[1]
    assert f'rank      : {failing_rank}' in root_cause
    assert f'RuntimeError: rank {failing_rank} fails on purpose' in root_cause
    # the other rank says why it stopped, in one line
    other = 1 - int(failing_rank)
    stopped = [line for line in out.splitlines() if line.startswith(f'[rank {other}] stopped: ')]
    assert len(stopped) == 1 and 'another process of this distributed run failed' in stopped[0]
    if other_rank_sleep != '0':
        assert '(SIGTERM)' in stopped[0]
    assert 'Iter(train) [3/9]' not in out
    assert _processes_mentioning(str(tmp_path)) == []


@pytest.mark.parametrize('error', ['peer', 'other'])
def test_the_launchers_sigterm_during_the_report_does_not_silence_it(monkeypatch, capsys, error):
    """A rank whose collective fails because its peer died is being reported when torchrun's
    SIGTERM arrives (0.1 s after the failure): the one-line report still comes out and the rank
    exits with status 1 (before, the signal raised inside the handler and the rank ended
    without a word)."""
    import signal

    from mmeffvit.engine import errors
    monkeypatch.setenv('TORCHELASTIC_RUN_ID', 'test')
    monkeypatch.setenv('WORLD_SIZE', '2')
    monkeypatch.setenv('RANK', '0')
    monkeypatch.delenv('TORCHELASTIC_ERROR_FILE', raising=False)
    classify = errors._peer_failure

    def sigterm_then_classify(err):
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher, while the handler runs
        return classify(err)

    monkeypatch.setattr(errors, '_peer_failure', sigterm_then_classify)
    message = ('Connection closed by peer' if error == 'peer' else
               'rank 0 fails on its own')

    def main(argv):
        raise RuntimeError(message)

    previous = signal.getsignal(signal.SIGTERM)
    try:
        if error == 'peer':
            with pytest.raises(SystemExit) as exc:
                errors.run_cli(main, [])
            assert exc.value.code == 1
            stopped = [line for line in capsys.readouterr().err.splitlines()
                       if line.startswith('[rank 0] stopped: ')]
            assert len(stopped) == 1 and 'another process' in stopped[0]
        else:  # not a user's error: re-raised as it is, not replaced by LauncherStopped
            with pytest.raises(RuntimeError, match='fails on its own'):
                errors.run_cli(main, [])
    finally:
        signal.signal(signal.SIGTERM, previous)
