"""Checkpoint loading under torch's weights_only default, and state-dict unwrapping."""
import argparse
import pickle

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import _load_checkpoint

import mmeffvit  # noqa: F401  (installs the loader)
from mmeffvit.utils import load_checkpoint_file, unwrap_state_dict


def runner_like_checkpoint(path):
    """What mmengine's runner saves: weights plus a message hub holding HistoryBuffers."""
    buf = HistoryBuffer()
    buf.update(0.5)
    buf.update(np.float64(0.25))
    torch.save({'meta': {'epoch': 1, 'seed': np.int64(3)}, 'state_dict': {'w': torch.ones(2)},
                'message_hub': {'log_scalars': {'train/loss': buf}}}, path)


def test_mmengine_loader_reads_runner_checkpoints(tmp_path):
    path = tmp_path / 'iter_2.pth'
    runner_like_checkpoint(path)
    with pytest.raises(pickle.UnpicklingError):  # what torch alone does
        torch.load(path)
    ckpt = _load_checkpoint(str(path), map_location='cpu')
    assert torch.equal(ckpt['state_dict']['w'], torch.ones(2))
    assert ckpt['message_hub']['log_scalars']['train/loss'].mean() == pytest.approx(0.375)


def test_mmengine_loader_refuses_foreign_objects(tmp_path, monkeypatch):
    path = tmp_path / 'foreign.pth'
    torch.save({'model': {'w': torch.ones(1)}, 'args': argparse.Namespace(lr=1)}, path)
    monkeypatch.delenv('MMEFFVIT_TRUST_CHECKPOINTS', raising=False)
    with pytest.raises(pickle.UnpicklingError, match=r"argparse.Namespace.*--trust-checkpoint"):
        _load_checkpoint(str(path), map_location='cpu')
    with pytest.raises(pickle.UnpicklingError, match='argparse.Namespace'):
        load_checkpoint_file(str(path))  # no longer trusted because it is local
    # the tensors-only reader keeps the weights and drops the Namespace
    assert list(load_checkpoint_file(str(path), tensors_only=True)) == ['model']
    # the explicit opt-in unpickles in full
    monkeypatch.setenv('MMEFFVIT_TRUST_CHECKPOINTS', '1')
    assert _load_checkpoint(str(path), map_location='cpu')['args'].lr == 1


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint_file(str(tmp_path / 'nope.pth'))
    good = tmp_path / 'good.pth'
    torch.save({'w': torch.ones(1000)}, good)
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(good.read_bytes()[:300])
    with pytest.raises(RuntimeError, match='corrupt or truncated'):
        load_checkpoint_file(str(cut))


@pytest.mark.parametrize('wrap', ['raw', 'state_dict', 'model', 'ddp', 'detector'])
def test_unwrap_state_dict_layouts(wrap):
    sd = {'a.weight': torch.ones(1)}
    ckpt = {
        'raw': sd,
        'state_dict': {'state_dict': sd, 'meta': {}},
        'model': {'model': sd, 'epoch': 3},
        'ddp': {'model': {'module.' + k: v for k, v in sd.items()}},
        'detector': {'state_dict': {'backbone.a.weight': torch.ones(1), 'neck.b': torch.ones(1)}},
    }[wrap]
    assert list(unwrap_state_dict(ckpt)) == ['a.weight']


def test_unwrap_rejects_non_tensor_values():
    with pytest.raises(TypeError, match='not tensors'):
        unwrap_state_dict({'model': {'a': 1}})


def test_unwrap_with_explicit_prefix():
    ckpt = {'state_dict': {'backbone.a': torch.ones(1), 'neck.b': torch.ones(1)}}
    assert list(unwrap_state_dict(ckpt, prefix='neck.')) == ['b']
    with pytest.raises(KeyError, match='prefix'):
        unwrap_state_dict(ckpt, prefix='head.')
