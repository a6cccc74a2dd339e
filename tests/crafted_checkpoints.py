"""Checkpoints that run code when unpickled in full, and official-like ones, for the tests.

Each payload writes a marker file; a safe reader must refuse the file before that happens. The
objects below only pickle into the opcodes an attacker would write (``__reduce__`` returning a
callable and its arguments); nothing here is executed when the files are written.
"""
import argparse
import contextlib
import copyreg
import os
import sys
import types

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEG_CFG = os.path.join(ROOT, 'configs', 'demo', 'fpn_flatten_pvt_t_80k_shapes.py')


class Call:
    """Pickles as ``func(*args)``; ``func`` may itself be a pickled expression."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __call__(self):  # pickle only accepts callables as the function of a reduce
        raise AssertionError('never called while pickling')

    def __reduce__(self):
        return self.func, self.args


def attr(obj, name):
    """``getattr(obj, name)`` as a pickled expression."""
    return Call(getattr, obj, name)


def builtin(name):
    """A builtin reached from HistoryBuffer (an allowed global) through getattr alone."""
    init_globals = attr(attr(HistoryBuffer, '__init__'), '__globals__')
    builtins_dict = Call(attr(init_globals, 'get'), '__builtins__')
    return Call(attr(builtins_dict, 'get'), name)


def payloads(marker):
    """``{name: picklable object that creates marker when unpickled in full}``."""
    code = f'open({str(marker)!r}, "w").write("ran")'
    return {
        'getattr_exec': Call(builtin('exec'), code),
        'getattr_eval': Call(builtin('eval'), f'exec({code!r})'),
        'getattr_os_system': Call(attr(Call(builtin('__import__'), 'os'), 'system'),
                                  f'touch {marker}'),
        'reduce_posix_system': Call(os.system, f'touch {marker}'),
        'reduce_subprocess': Call(__import__('subprocess').call, ['touch', str(marker)]),
        'reduce_exec': Call(exec, code),
    }


def runner_checkpoint(payload=None, where=None):
    """What mmengine's runner saves (weights, message hub of HistoryBuffers, meta), optionally
    with ``payload`` placed in the message hub, the meta or the state dict."""
    buf = HistoryBuffer()
    buf.update(0.5)
    buf.update(np.float64(0.25))
    ckpt = {
        'meta': {'epoch': 1, 'iter': 2, 'seed': np.int64(3), 'cfg': "model = dict(type='X')",
                 'dataset_meta': {'classes': ('a', 'b'), 'palette': [(1, 2, 3)]}},
        'state_dict': {'w': torch.ones(2)},
        'message_hub': {'log_scalars': {'train/loss': buf}, 'runtime_info': {'iter': 2},
                        'resumed_keys': {'iter': True}},
    }
    if where == 'message_hub':
        ckpt['message_hub']['log_scalars']['train/evil'] = payload
    elif where == 'meta':
        ckpt['meta']['dataset_meta']['classes'] = payload
    elif where == 'state_dict':
        ckpt['state_dict']['evil'] = payload
    elif where == 'history_buffer':  # a statistics method, merged into HistoryBuffer's class
        ckpt['message_hub']['log_scalars']['train/evil'] = BufferState(
            {'max_length': 10, '_log_history': np.ones(1), '_count_history': np.ones(1),
             'statistics_methods': {'mean': payload}})
    return ckpt


class BufferState:
    """Pickles as a HistoryBuffer rebuilt with ``state`` (NEWOBJ + BUILD, as mmengine writes)."""

    def __init__(self, state):
        self.state = state

    @property
    def __class__(self):  # the pickler checks that NEWOBJ's class is the object's
        return HistoryBuffer

    def __reduce__(self):
        return copyreg.__newobj__, (HistoryBuffer, ), self.state


class CfgNode(dict):
    """Stand-in for yacs' CfgNode (a dict subclass with attributes), pickled under yacs' name."""


CfgNode.__module__, CfgNode.__qualname__ = 'yacs.config', 'CfgNode'


def official_checkpoint(weights):
    """What official training scripts save: weights under 'model' beside argparse and yacs
    objects, optimizer state and numpy scalars."""
    config = CfgNode(MODEL=CfgNode(TYPE='flatten'))
    config.__dict__['__immutable__'] = True
    return {'model': weights, 'optimizer': {'state': {}, 'param_groups': [{'lr': 1e-3}]},
            'args': argparse.Namespace(lr=1e-3, model='flatten_pvt_tiny'), 'config': config,
            'max_accuracy': np.float64(75.1), 'epoch': 299}


@contextlib.contextmanager
def _yacs_importable():
    """Let the pickler check that yacs.config.CfgNode exists; readers later find no yacs."""
    added = [name for name in ('yacs', 'yacs.config') if name not in sys.modules]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    sys.modules['yacs.config'].CfgNode = CfgNode
    try:
        yield
    finally:
        for name in added:
            del sys.modules[name]


def save(obj, path, legacy=False):
    with _yacs_importable():
        torch.save(obj, str(path), _use_new_zipfile_serialization=not legacy)
    return str(path)


def build_segmentor(backbone=None, in_channels=None, num_classes=None):
    """The seg demo's Semantic FPN (FLatten-PVT-T unless ``backbone`` is given)."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    cfg = Config.fromfile(SEG_CFG)
    if backbone:
        cfg.model.backbone = backbone
        cfg.model.neck.in_channels = in_channels
    if num_classes:
        cfg.model.decode_head.num_classes = num_classes
    init_default_scope('mmseg')
    return MODELS.build(cfg.model), cfg
