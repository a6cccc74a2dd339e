"""Whether a checkpoint fits the model it is loaded into, and what the file is when it does not.

mmengine loads state dicts with ``strict=False``: a file that matches nothing, or another
backbone's weights, only logs warnings and the run goes on from random weights. The check here
stops such loads with an error that names the expected and found key prefixes and, where it can,
what the file is ("a FLatten-Swin-T checkpoint; the config builds FLatten-PVT-T"): mmeffvit
backbones are recognised from the file's key/shape signature, mmengine run files from their meta.
Partial loads (e.g. a detector fine-tuned with another number of classes: a few head tensors
differ) keep mmengine's report plus one line, "n of m tensors loaded".
"""
import functools
import logging
import math
import re
import weakref
from collections import Counter, deque

import torch
from mmengine.logging import print_log
from torch.overrides import TorchFunctionMode


class CheckpointMismatchError(RuntimeError):
    """The checkpoint does not fit the model (nothing, or mostly wrong shapes, would load)."""


# -- fit of one state dict in one module --------------------------------------------------------
class FitReport:
    """How the tensors of a file (``found``: name -> shape) fit a module (``own``)."""

    def __init__(self, own, found):
        self.own = {k: v for k, v in own.items() if not k.endswith('num_batches_tracked')}
        self.found = found
        common = [k for k in self.own if k in found]
        self.loaded = [k for k in common if tuple(found[k]) == tuple(self.own[k])]
        self.mismatched = [k for k in common if tuple(found[k]) != tuple(self.own[k])]
        self.missing = [k for k in self.own if k not in found]
        self.unexpected = [k for k in found if k not in own]

    @property
    def fatal(self):
        """As a backbone's weights: nothing loads, most shared keys differ in shape, under half
        of the module loads, or the file has many keys the module lacks (a deeper variant)."""
        n = len(self.loaded)
        return (n == 0 or len(self.mismatched) > n or n < len(self.own) / 2
                or len(self.unexpected) > n / 2)

    @property
    def complete(self):
        return not (self.missing or self.mismatched or self.unexpected)

    def line(self):
        return f'{len(self.loaded)} of {len(self.own)} tensors loaded'

    def mismatch_examples(self, limit=3):
        return ', '.join(f'{k} {tuple(self.found[k])} vs {tuple(self.own[k])}'
                         for k in self.mismatched[:limit])


def shapes_of(state_dict):
    """``{name: shape}`` of the tensors of a state dict."""
    return {k: tuple(v.shape) for k, v in state_dict.items() if isinstance(v, torch.Tensor)}


def key_prefixes(keys, depth=1, limit=6):
    """``'backbone. (164), neck. (16)'``: the commonest key prefixes of ``depth`` components."""
    counts = Counter('.'.join(k.split('.')[:depth]) + '.' if k.count('.') >= depth else k
                     for k in keys)
    shown = ', '.join(f'{p} ({n})' for p, n in counts.most_common(limit))
    return shown + (', ...' if len(counts) > limit else '') if counts else 'none'


# -- what a model and a file are ----------------------------------------------------------------
_SHORT_ARCH = dict(tiny='T', small='S', medium='M', base='B', large='L')


def display_name(class_name, arch=None):
    """``('FLattenSwin', 'tiny')`` -> ``'FLatten-Swin-T'``; ``'base_384'`` -> ``'B@384'``."""
    name = re.sub(r'^FLatten(?=[A-Z])', 'FLatten-', class_name)
    if not arch:
        return name
    size, _, res = str(arch).partition('_')
    short = _SHORT_ARCH.get(size, size.upper())
    return f'{name}-{short}' + (f'@{res}' if res else '')


def _mmeffvit_backbones():
    """``{class name: class}`` of the registered mmeffvit backbones with named archs (read from
    the registry: ``utils`` imports nothing from ``models``, whose backbones import this)."""
    from ..registry import MODELS
    MODELS.import_from_location()
    return {name: cls for name, cls in sorted(MODELS.module_dict.items())
            if isinstance(cls, type) and cls.__module__.startswith('mmeffvit.models.backbones.')
            and callable(getattr(cls, 'convert_weights', None))
            and getattr(cls, 'arch_settings', None)}


def module_variant(module):
    """``'FLatten-PVT-T'`` for an mmeffvit backbone built with a named arch, else None."""
    cls = type(module)
    arch = getattr(module, 'arch', None)
    for name, settings in (getattr(cls, 'arch_settings', None) or {}).items():
        if settings == arch:
            return display_name(cls.__name__, name)
    return None


def module_name(module):
    """:func:`module_variant`, or the class name."""
    return module_variant(module) or display_name(type(module).__name__)


class _LargeTensorsOnMeta(TorchFunctionMode):
    """Allocate the big tensors of a constructor on the meta device, keep small ones on the CPU.

    Several backbones turn small tensors into Python numbers while they are built (drop-path
    rates, index tables), which the meta device cannot do; the weights are what costs time.
    """
    factories = (torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self.factories and kwargs.get('device') is None:
            size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
            if all(isinstance(s, int) for s in size) and math.prod(size) >= 4096:
                kwargs['device'] = 'meta'
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _signature(class_name, arch):
    """``{name: shape}`` of a backbone built with default arguments (cached per process)."""
    cls = _mmeffvit_backbones()[class_name]
    with _LargeTensorsOnMeta(), torch.no_grad():
        model = cls(arch=arch)
    return shapes_of(model.state_dict())


def _pattern(key):
    return re.sub(r'\d+', '#', key)


def recognise(found):
    """``'FLatten-Swin-T'`` when ``found`` (name -> shape) is an mmeffvit backbone's weights.

    Families are ranked by the overlap of their key patterns (indices removed) with the file's,
    using the first arch of each; the archs of the two best families are then compared key by
    key, shapes included. Returns None when nothing fits at least half of the keys.
    """
    if not found:
        return None
    patterns = {_pattern(k) for k in found}
    families = []
    for name, cls in _mmeffvit_backbones().items():
        try:
            sig = _signature(name, next(iter(cls.arch_settings)))
        except Exception:  # a backbone that needs arguments to build: not a candidate
            continue
        theirs = {_pattern(k) for k in sig}
        families.append((len(patterns & theirs) / len(patterns | theirs), name))
    families.sort(reverse=True)
    best = (0., None)
    for overlap, name in families[:2]:
        for arch in _mmeffvit_backbones()[name].arch_settings:
            try:
                sig = _signature(name, arch)
            except Exception:
                continue
            same = sum(1 for k, shape in found.items() if sig.get(k) == shape)
            score = same / max(len(sig), len(found))
            if score > best[0]:
                best = (score, display_name(name, arch))
    if best[0] >= .5:
        return best[1]
    if families and families[0][0] >= .5:
        return f'{display_name(families[0][1])} of an unknown arch'
    return None


def _other_variant(found, module):
    """The variant ``found`` is when it is recognised as another one than ``module`` (the
    pre-training size aside: ``FLatten-CSWin-B@384`` weights suit a ``-B``), else None."""
    ours = module_variant(module)
    theirs = recognise(found) if ours else None
    if theirs and 'unknown arch' not in theirs and theirs.split('@')[0] != ours.split('@')[0]:
        return theirs
    return None


def _config_backbone(cfg_text):
    """``(type, arch)`` of ``backbone=dict(...)`` in a config's text, read without running it."""
    start = cfg_text.find('backbone=dict(')
    if start < 0:
        return None, None
    depth, top = 0, []
    for char in cfg_text[start + len('backbone=dict('):]:
        depth += char == '('
        if char == ')':
            if depth == 0:
                break
            depth -= 1
        elif depth == 0:
            top.append(char)
    top = ''.join(top)  # the backbone's own arguments, nested dicts left out
    found = [re.search(rf"\b{k}\s*=\s*'([^']*)'", top) for k in ('type', 'arch')]
    return tuple(m.group(1) if m else None for m in found)


def describe_meta(meta):
    """What an mmengine run file's ``meta`` says about it (config name, backbone), or ''."""
    if not isinstance(meta, dict):
        return ''
    parts = []
    run = meta.get('experiment_name')
    if isinstance(run, str):  # '<config name>_<date>_<time>'
        parts.append('written by an mmengine run of ' + re.sub(r'_\d{8}_\d{6}$', '', run))
    if isinstance(meta.get('cfg'), str):
        kind, arch = _config_backbone(meta['cfg'])
        if kind:
            parts.append(f"backbone {display_name(kind.split('.')[-1], arch)}")
    return ', '.join(parts)


# -- where a state dict came from (for the messages) --------------------------------------------
_RECENT_SOURCES = deque(maxlen=8)  # (weak reference to one tensor of the file, description)


def remember_source(checkpoint, filename):
    """Note ``filename`` and its meta for the tensors of ``checkpoint``; return ``checkpoint``."""
    if isinstance(checkpoint, dict):
        weights = checkpoint.get('state_dict', checkpoint)
        first = next((v for v in weights.values() if isinstance(v, torch.Tensor)), None) \
            if isinstance(weights, dict) else None
        if first is not None:
            _RECENT_SOURCES.append((weakref.ref(first),
                                    (str(filename), describe_meta(checkpoint.get('meta')))))
    return checkpoint


def _source_of(state_dict):
    ids = {id(v) for v in state_dict.values() if isinstance(v, torch.Tensor)}
    for ref, source in reversed(_RECENT_SOURCES):
        tensor = ref()
        if tensor is not None and id(tensor) in ids:
            return source
    return None, ''


# -- the check ----------------------------------------------------------------------------------
def _unwrap(module):
    from mmengine.model import BaseTTAModel, is_model_wrapper
    while is_model_wrapper(module) or isinstance(module, BaseTTAModel):
        module = module.module
    return module


def check_fit(model, state_dict, source='the checkpoint', meta_text='', is_backbone=False):
    """Raise :class:`CheckpointMismatchError` when ``state_dict`` does not fit ``model``.

    Whole model: an error when no tensor would load or most shared keys differ in shape. Its
    backbone (``model.backbone``, when the file has ``backbone.`` keys): also when under half of
    its tensors would load, the file has many backbone keys it lacks (:attr:`FitReport.fatal`),
    or, when the load is partial, the file is recognised as another variant of a backbone.
    ``is_backbone`` (a backbone's pretrained weights, already converted): the backbone rules for
    the whole model, and any shape difference is an error.

    Returns:
        FitReport: of the whole model.
    """
    found = shapes_of(state_dict)
    report = FitReport(shapes_of(model.state_dict()), found)
    backbone = getattr(model, 'backbone', None)
    part_report = None
    if isinstance(backbone, torch.nn.Module) and any(k.startswith('backbone.') for k in found):
        part_report = FitReport(
            shapes_of(backbone.state_dict()),
            {k[len('backbone.'):]: v for k, v in found.items() if k.startswith('backbone.')})
    whole_fails = not report.loaded or len(report.mismatched) > len(report.loaded)
    if is_backbone and (report.fatal or report.mismatched):
        whole_fails = True
    part_fails = bool(part_report and part_report.fatal)
    # all shapes may fit and the file still be another variant (PVT-T weights in a PVT-S)
    what = None
    if is_backbone and not whole_fails and not report.complete:
        what = _other_variant(found, model)
        whole_fails = what is not None
    elif part_report and not whole_fails and not part_fails and not part_report.complete:
        what = _other_variant(part_report.found, backbone)
        part_fails = what is not None
    if not whole_fails and not part_fails:
        return report
    failing = part_report if part_report and not whole_fails else report
    where = f"the model's backbone ({module_name(backbone)})" if failing is part_report else (
        f'{module_name(model)}' + (f' (backbone {module_name(backbone)})'
                                   if isinstance(backbone, torch.nn.Module) else ''))
    lines = [f'{source} does not fit {where}: {len(failing.loaded)} of its '
             f'{len(failing.own)} tensors would load']
    if failing.mismatched:
        lines.append(f'{len(failing.mismatched)} differ in shape (file vs model: '
                     f'{failing.mismatch_examples()})')
    if failing.unexpected:
        lines.append(f'{len(failing.unexpected)} tensors of the file have no place in it')
    lines.append(f'the model expects keys under {key_prefixes(failing.own)}; the file has '
                 f'{key_prefixes(failing.found)}')
    if what is None:
        what = recognise(failing.found if failing is part_report else _backbone_keys(found))
    if what or meta_text:
        model_part = backbone if isinstance(backbone, torch.nn.Module) else model
        lines.append(f"the file is {f'a {what} checkpoint' if what else 'an mmengine checkpoint'}"
                     + (f' ({meta_text})' if meta_text else '')
                     + f'; the config builds {module_name(model_part)}')
        if what and isinstance(backbone, torch.nn.Module) and part_report is None:
            lines.append('to use backbone weights, give them to model.backbone.init_cfg='
                         "dict(type='Pretrained', checkpoint=...) instead")
    raise CheckpointMismatchError('; '.join(lines) + '.')


def _backbone_keys(found):
    if any(k.startswith('backbone.') for k in found):
        return {k[len('backbone.'):]: v for k, v in found.items() if k.startswith('backbone.')}
    return found


def guard_load_state_dict(load_state_dict):
    """Wrap mmengine's ``load_state_dict(module, state_dict, strict, logger)`` with the check."""
    if getattr(load_state_dict, 'mmeffvit_fit_check', False):
        return load_state_dict

    @functools.wraps(load_state_dict)
    def checked(module, state_dict, strict=False, logger=None):
        filename, meta_text = _source_of(state_dict)
        source = f'checkpoint {filename}' if filename else 'the checkpoint'
        report = check_fit(_unwrap(module), state_dict, source=source, meta_text=meta_text)
        load_state_dict(module, state_dict, strict, logger)
        print_log(f'{source}: {report.line()}', logger=logger or 'current',
                  level=logging.INFO if report.complete else logging.WARNING)

    checked.mmeffvit_fit_check = True
    return checked
