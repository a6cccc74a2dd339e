"""No checkpoint reader runs code from the file (issue 11, item 1).

Crafted files (getattr chains from HistoryBuffer to exec/eval/os.system, ``__reduce__`` to
posix.system / subprocess / builtins.exec, placed in the message hub, the meta, the state dict and
a HistoryBuffer's statistics) go through every in-process entry point; each must refuse the file
and leave the payload's marker file uncreated. The payloads are shown to be live first (a full
unpickle does create the marker), so these tests fail if a reader unpickles in full.
"""
import importlib.util
import logging
import os.path as osp
import pickle
import shutil
import sys

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint

import mmeffvit  # noqa: F401  (installs the loaders)
import mmeffvit.utils.checkpoint as checkpoint_module
from mmeffvit.models import FLattenPVT
from mmeffvit.utils.checkpoint import (TRUST_ENV, CorruptCheckpointError, UnsafeCheckpointError,
                                       add_trust_argument, apply_trust_argument,
                                       load_checkpoint_file, trust_requested)

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from crafted_checkpoints import (official_checkpoint, payloads, runner_checkpoint,  # noqa: E402
                                 save)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    '_tool_flatten2mmeffvit', osp.join(ROOT, 'tools', 'model_converters', 'flatten2mmeffvit.py'))
converter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(converter)

PAYLOADS = sorted(payloads('m'))
PLACES = ['message_hub', 'meta', 'state_dict', 'history_buffer']
# what each payload makes the readers name
NAMED = dict(getattr_exec="getattr(HistoryBuffer, '__init__')",
             getattr_eval="getattr(HistoryBuffer, '__init__')",
             getattr_os_system="getattr(HistoryBuffer, '__init__')",
             reduce_posix_system='posix.system', reduce_subprocess='subprocess.call',
             reduce_exec='builtins.exec')


@pytest.fixture(autouse=True)
def _untrusted(monkeypatch):
    monkeypatch.setenv(TRUST_ENV, '')  # restored afterwards, also when a test sets it directly


@pytest.fixture
def crafted(tmp_path):
    """``make(payload, place) -> path`` of a runner-like file carrying the payload; ``marker``."""
    marker = tmp_path / 'marker'

    def make(name, place='message_hub'):
        return save(runner_checkpoint(payloads(marker)[name], place), tmp_path / f'{name}.pth')

    make.marker = marker
    return make


def fetch_from(local_path):
    """A stand-in for torch.hub's download that copies a local file (no network in tests)."""
    def download(url, dst, hash_prefix=None, progress=True):
        shutil.copy(local_path, dst)
    return download


@pytest.mark.parametrize('name', PAYLOADS)
def test_payloads_are_live(crafted, name):
    """Unpickled in full, each crafted file runs its payload (so the refusals below matter)."""
    path = crafted(name)
    torch.load(path, weights_only=False)
    assert crafted.marker.exists()


@pytest.mark.parametrize('place', PLACES)
@pytest.mark.parametrize('name', PAYLOADS)
@pytest.mark.parametrize('reader', ['runner', 'tensors_only', 'mmengine_local', 'mmengine_http'])
def test_readers_refuse_crafted_files(crafted, name, place, reader, tmp_path, monkeypatch):
    path = crafted(name, place)
    with pytest.raises(UnsafeCheckpointError) as info:
        if reader == 'runner':
            load_checkpoint_file(path)
        elif reader == 'tensors_only':
            load_checkpoint_file(path, tensors_only=True)
        elif reader == 'mmengine_local':
            _load_checkpoint(path, map_location='cpu')
        else:
            monkeypatch.setattr(torch.hub, 'download_url_to_file', fetch_from(path))
            CheckpointLoader.load_checkpoint(f'https://example.com/{name}_{place}.pth',
                                             map_location='cpu')
    assert not crafted.marker.exists()
    assert NAMED[name] in str(info.value)
    assert '--trust-checkpoint' in str(info.value) and TRUST_ENV in str(info.value)


@pytest.mark.parametrize('name', PAYLOADS)
def test_pretrained_init_refuses_crafted_files(crafted, name):
    path = crafted(name, 'state_dict')
    backbone = FLattenPVT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(UnsafeCheckpointError, match='refused'):
        backbone.init_weights()
    assert not crafted.marker.exists()


def test_pretrained_init_over_http_refuses_crafted_files(crafted, monkeypatch):
    path = crafted('getattr_exec', 'meta')
    monkeypatch.setattr(torch.hub, 'download_url_to_file', fetch_from(path))
    backbone = FLattenPVT(arch='tiny', init_cfg=dict(
        type='Pretrained', checkpoint='https://example.com/pvt_t.pth'))
    with pytest.raises(UnsafeCheckpointError):
        backbone.init_weights()
    assert not crafted.marker.exists()


@pytest.mark.parametrize('name', PAYLOADS)
def test_converter_refuses_crafted_files(crafted, name, tmp_path):
    src = save(official_checkpoint({'w': payloads(crafted.marker)[name]}), tmp_path / 'o.pth')
    with pytest.raises(UnsafeCheckpointError):
        converter.main([src, str(tmp_path / 'out.pth')])
    assert not crafted.marker.exists() and not (tmp_path / 'out.pth').exists()


def test_history_buffer_statistics_stay_its_own(tmp_path):
    """A buffer whose statistics hold another allowed callable is refused before it is merged
    into HistoryBuffer's class-wide table (a full unpickle would replace 'mean')."""
    HistoryBuffer()  # registers the default statistics
    path = save(runner_checkpoint(np.ndarray, 'history_buffer'), tmp_path / 'hb.pth')
    with pytest.raises(UnsafeCheckpointError, match='foreign statistics'):
        load_checkpoint_file(path)
    assert HistoryBuffer._statistics_methods['mean'] is vars(HistoryBuffer)['mean']


def test_runner_files_load_whole(tmp_path):
    """What mmengine's runner writes loads with no flag; buffers come back as HistoryBuffer."""
    path = save(runner_checkpoint(), tmp_path / 'iter_2.pth')
    with pytest.raises(pickle.UnpicklingError):  # torch alone refuses the getattr
        torch.load(path)
    for ckpt in (load_checkpoint_file(path), _load_checkpoint(path, map_location='cpu')):
        buf = ckpt['message_hub']['log_scalars']['train/loss']
        assert type(buf) is HistoryBuffer
        assert buf.mean() == pytest.approx(0.375) and buf.statistics('current') == 0.25
        assert ckpt['meta']['dataset_meta']['classes'] == ('a', 'b')
    # saved again, the file names mmengine's class (not the checking subclass)
    resaved = tmp_path / 'again.pth'
    torch.save(ckpt, resaved)
    assert 'mmeffvit' not in ' '.join(torch.serialization.get_unsafe_globals_in_checkpoint(
        str(resaved)))
    assert load_checkpoint_file(str(resaved))['meta']['iter'] == 2


@pytest.mark.parametrize('legacy', [False, True])
def test_official_files_give_their_tensors(tmp_path, legacy):
    """argparse / yacs objects (the yacs class pickled under its own module name, which is not
    installed) are refused by the runner reader and skipped by the tensors-only reader."""
    weights = FLattenPVT(arch='tiny').state_dict()
    path = save(official_checkpoint(weights), tmp_path / 'pvt_t.pth', legacy=legacy)
    with pytest.raises(UnsafeCheckpointError, match='argparse.Namespace'):
        load_checkpoint_file(path)
    ckpt = load_checkpoint_file(path, tensors_only=True)
    assert list(ckpt) == ['model']
    assert all(torch.equal(ckpt['model'][k], v) for k, v in weights.items())
    backbone = FLattenPVT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=path))
    backbone.init_weights()
    assert all(torch.equal(backbone.state_dict()[k], v) for k, v in weights.items())


def test_converter_reads_official_files(tmp_path):
    weights = FLattenPVT(arch='tiny').state_dict()
    src = save(official_checkpoint(weights), tmp_path / 'pvt_t.pth')
    meta = converter.convert(src, str(tmp_path / 'out.pth'), verbose=False)
    assert meta['type'] == 'FLattenPVT' and meta['backbone']['arch'] == 'tiny'
    out = load_checkpoint_file(str(tmp_path / 'out.pth'))
    assert torch.equal(out['state_dict']['backbone.pos_embed1'], weights['pos_embed1'])


def test_trust_opt_in(tmp_path, monkeypatch):
    """--trust-checkpoint / the environment variable unpickle a refused file in full, warning."""
    import argparse
    path = save({'model': {'w': torch.ones(1)},
                 'args': argparse.Namespace(model='flatten_pvt_tiny')}, tmp_path / 'o.pth')
    parser = argparse.ArgumentParser()
    add_trust_argument(parser)
    assert not parser.parse_args([]).trust_checkpoint
    apply_trust_argument(parser.parse_args([]))
    assert not trust_requested()
    with pytest.raises(UnsafeCheckpointError):
        _load_checkpoint(path, map_location='cpu')
    apply_trust_argument(parser.parse_args(['--trust-checkpoint']))
    assert trust_requested()
    logged = []
    monkeypatch.setattr(checkpoint_module, 'print_log',
                        lambda msg, logger=None, level=None: logged.append((level, msg)))
    ckpt = _load_checkpoint(path, map_location='cpu')
    assert ckpt['args'].model == 'flatten_pvt_tiny'
    (level, msg), = logged
    assert level == logging.WARNING and 'unpickled in full' in msg and 'argparse.Namespace' in msg
    monkeypatch.setenv(TRUST_ENV, '0')
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint_file(path)


def test_corrupt_and_foreign_files(tmp_path):
    garbage = tmp_path / 'garbage.pth'
    garbage.write_bytes(bytes(range(256)) * 4)
    text = tmp_path / 'text.pth'
    text.write_text('not a checkpoint\n' * 10)
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    for path in (garbage, text, empty):
        for tensors_only in (False, True):
            with pytest.raises(CorruptCheckpointError, match=str(path)):
                load_checkpoint_file(str(path), tensors_only=tensors_only)
