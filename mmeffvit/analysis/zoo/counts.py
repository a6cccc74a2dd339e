"""Parameter and MAC counts of the model zoo, cached in ``docs/model_zoo_counts.json``.

Counting a backbone at 800×1333 takes seconds to a minute on a CPU and the zoo needs about a
hundred counts, so ``tools/analysis/model_zoo.py`` keeps them in a table that its ``--check``
reads (seconds) and that ``--recount`` recounts and compares (``tests/test_model_zoo.py``, slow).

Two kinds of entry:

* ``backbones``: ``params`` and ``macs`` of one model on a ``1×3×H×W`` input, keyed by a
  readable description of what is built (``backbone:FLattenPVT(arch='tiny', ...)@800x1333`` or
  ``classifier:...@224x224``). A change of the constructor arguments is a new key, so a stale
  count cannot be read: the check names the missing entries.
* ``models``: ``params`` of the whole detector / segmentor / classifier of a config (and its
  ``macs`` for a classifier, on a 224² image), keyed by
  the config's name, with a ``fingerprint`` of what the config says about its model (the model
  dict read from the file and its local bases, and the toolbox bases it names): when the config
  changes, the fingerprint no longer matches and the entry counts as missing.
"""
import hashlib
import inspect
import json
import os.path as osp
from functools import lru_cache

import torch

from ..complexity import analyze, count_params
from ..models import build_backbone, build_classifier, config_complexity

#: constructor arguments that change neither the structure nor the counts (training behaviour,
#: initialisation); they are left out of the keys so that configs share entries
TRAINING_ONLY = frozenset(['_delete_', 'init_cfg', 'pretrained', 'drop_path_rate', 'drop_rate',
                           'attn_drop_rate', 'frozen_stages', 'norm_eval', 'with_cp',
                           'use_checkpoint'])


def _canonical(value):
    """Hashable, order-independent form of a config value (lists and tuples alike)."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(v) for v in value)
    return value


def model_args(backbone_cfg):
    """``(type name, constructor kwargs)`` of a config's backbone dict, training keys removed."""
    type_name = str(backbone_cfg.get('type', '')).split('.')[-1]
    kwargs = {k: v for k, v in backbone_cfg.items() if k != 'type' and k not in TRAINING_ONLY}
    return type_name, kwargs


@lru_cache(maxsize=None)
def _constructor_parameters(type_name):
    from ...registry import MODELS
    cls = MODELS.get(type_name)  # logs on every lookup: done once per type
    return inspect.signature(cls.__init__).parameters if cls is not None else {}


def without_defaults(type_name, kwargs):
    """``kwargs`` less the arguments that restate the constructor's default (``arch`` kept), so
    that a config restating defaults shares the entry of the plain variant."""
    params = _constructor_parameters(type_name)
    return {k: v for k, v in kwargs.items()
            if k == 'arch' or k not in params
            or _canonical(v) != _canonical(params[k].default)}


def model_key(kind, type_name, kwargs, shape):
    """Readable cache key: ``kind:Type(k=v, ...)@HxW`` with sorted, canonical arguments."""
    args = ', '.join(f'{k}={_canonical(v)!r}' for k, v in sorted(kwargs.items()))
    return f'{kind}:{type_name}({args})@{shape[0]}x{shape[1]}'


def fingerprint(data):
    """Short digest of a JSON-able value (a config's literal model dict and toolbox bases)."""
    text = json.dumps(data, sort_keys=True, default=repr)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def count_model(kind, type_name, kwargs, shape):
    """Count one entry: ``{'params', 'macs'}`` of a backbone or ImageNet classifier."""
    torch.manual_seed(0)
    if kind == 'classifier':
        model = build_classifier(type_name, **kwargs)
    elif kind == 'backbone':
        model = build_backbone(type_name, dense=False, **kwargs)
    else:
        raise ValueError(f'unknown kind {kind!r}')
    report = analyze(model, torch.rand(1, 3, *shape))
    if report.unsupported_ops:
        raise RuntimeError(f'{type_name}: operators neither counted nor known to be MAC-free: '
                           f'{report.unsupported_ops}')
    return dict(params=report.params, macs=report.macs)


def count_config(path, shape=None):
    """``{'params'}`` of the whole model a config builds, in its scope, and with a ``shape``
    ``(H, W)`` its ``'macs'`` on one image of that size (tensor-mode forward)."""
    if shape is not None:
        report, _ = config_complexity(path, tuple(shape))
        return dict(params=report.params, macs=report.macs)
    from mmengine.config import Config
    from mmengine.registry import MODELS, DefaultScope, init_default_scope
    cfg = Config.fromfile(path)
    scope = cfg.get('default_scope', 'mmdet')
    init_default_scope(scope)
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(cfg.model)
    return dict(params=count_params(model))


class CountCache:
    """The table of counts: what is needed is looked up, missing entries are collected (check
    mode) or counted (write mode), and ``recount`` counts everything needed again."""

    def __init__(self, path, count=False, recount=False, progress=False):
        self.path, self.count, self.recount, self.progress = path, count, recount, progress
        data = {}
        if osp.exists(path):
            with open(path, encoding='utf-8') as f:
                data = json.load(f)
        self.old = dict(backbones=data.get('backbones', {}), models=data.get('models', {}))
        self.new = dict(backbones={}, models={})
        self.missing, self.changed = [], []

    def _lookup(self, section, key, fresh, valid=lambda entry: True):
        if key in self.new[section]:
            return self.new[section][key]
        cached = self.old[section].get(key)
        if cached is not None and not valid(cached):
            cached = None
        if cached is None:
            self.missing.append(key)  # not in the table (or stale): --check fails on it
        if self.recount or (cached is None and self.count):
            if self.progress:
                print(f'  counting {key}', flush=True)
            entry = fresh()
            if cached is not None and entry != cached:
                self.changed.append((key, cached, entry))
            if self.count:  # keep what a long run has counted should it stop
                self.old[section][key] = entry
                self._save(self.old)
        elif cached is None:
            return None
        else:
            entry = cached
        self.new[section][key] = entry
        return entry

    def backbone(self, kind, type_name, kwargs, shape):
        """``{'params', 'macs'}`` of a backbone / classifier, or None when not counted."""
        kwargs = without_defaults(type_name, kwargs)
        key = model_key(kind, type_name, kwargs, shape)
        return self._lookup('backbones', key,
                            lambda: count_model(kind, type_name, kwargs, shape))

    def config(self, name, path, print_, macs_shape=None):
        """``{'fingerprint', 'params'(, 'macs')}`` of a config's whole model (MACs counted on
        ``macs_shape`` when given), or None when not counted."""
        return self._lookup('models', name,
                            lambda: dict(fingerprint=print_, **count_config(path, macs_shape)),
                            lambda entry: entry.get('fingerprint') == print_
                            and (macs_shape is None or 'macs' in entry))

    @staticmethod
    def _text(sections):
        data = {'note': 'GENERATED by tools/analysis/model_zoo.py: counts of mmeffvit.analysis '
                        '(params; MACs = multiply-adds, element-wise work not counted)',
                'backbones': dict(sorted(sections['backbones'].items())),
                'models': dict(sorted(sections['models'].items()))}
        return json.dumps(data, indent=1, ensure_ascii=False) + '\n'

    def _save(self, sections):
        with open(self.path, 'w', encoding='utf-8') as f:
            f.write(self._text(sections))

    def text(self):
        """The JSON of the entries used by this run (unused ones are dropped)."""
        return self._text(self.new)
