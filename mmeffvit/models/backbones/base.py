"""Behaviour every mmeffvit backbone shares: stage freezing, ``norm_eval``, pretrained loading."""
import copy
import math
import re

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from ...utils import resize_token_grid, square_side, unknown_choice_error
from ...utils.checkpoint import download_checkpoint, load_checkpoint_file, unwrap_state_dict
from ...utils.checkpoint_fit import check_fit, describe_meta
from ..layers.norm import LayerNormFP32
from ..layers.relative_position import resize_bias_table


def resolve_arch(arch, arch_settings, aliases=None, required=()):
    """Turn an ``arch`` name (or a dict of settings) into a settings dict.

    Unknown names raise a ``KeyError`` that lists the valid ones, closest first.
    """
    if isinstance(arch, str):
        key = (aliases or {}).get(arch.lower(), arch.lower())
        if key not in arch_settings:
            raise unknown_choice_error('arch', arch,
                                       list(arch_settings) + list(aliases or {}))
        return copy.deepcopy(arch_settings[key])
    if not isinstance(arch, dict):
        raise TypeError(f'arch must be a str or a dict, got {type(arch).__name__}')
    missing = set(required) - set(arch)
    if missing:
        raise ValueError(f'a custom arch dict needs the keys {sorted(required)}; '
                         f'missing {sorted(missing)}')
    return copy.deepcopy(arch)


def check_stage_args(num_stages, out_indices, attn_types=None, attn_name='attn_types',
                     **per_stage):
    """Validate per-stage arguments shared by the pyramid backbones; return ``out_indices``.

    Args:
        num_stages (int): Number of stages.
        out_indices (Sequence[int]): Must be a non-empty subset of ``0..num_stages-1``.
        attn_types (str, optional): One letter per stage, ``'L'`` (linear) or ``'S'`` (softmax).
        attn_name (str): The constructor argument holding ``attn_types`` (for the error).
        **per_stage: Sequences that need one entry per stage (named in the error).

    Returns:
        tuple[int]: ``out_indices`` as a tuple.
    """
    for name, values in per_stage.items():
        if len(values) != num_stages:
            raise ValueError(f'{name} needs one entry per stage ({num_stages}), got {values}')
    if attn_types is not None and (not isinstance(attn_types, str)
                                   or len(attn_types) != num_stages
                                   or set(attn_types) - set('LS')):
        raise ValueError(f"{attn_name} needs one 'L' or 'S' per stage ({num_stages}), "
                         f'got {attn_types!r}')
    out_indices = tuple(out_indices)
    if not out_indices or any(not 0 <= i < num_stages for i in out_indices):
        raise ValueError(f'out_indices must be a non-empty subset of 0..{num_stages - 1}, '
                         f'got {out_indices}')
    return out_indices


class EffBackbone(BaseModule):
    """Base class of mmeffvit's dense-prediction backbones.

    Subclasses set :attr:`num_stages` when their arch decides it, build their layers, then call
    :meth:`_freeze_stages`, and implement :meth:`stage_modules` (what ``frozen_stages``
    freezes). :meth:`convert_weights` (official checkpoint → this model's names and sizes) is
    declared by the ``ckpt_*`` class attributes.

    Conventions follow mmdet's Swin: ``frozen_stages=-1`` freezes nothing, ``0`` freezes the stem
    (patch embedding) only, ``k >= 1`` the stem and the first ``k`` stages, each in eval mode with
    ``requires_grad=False``. ``norm_eval=True`` keeps BatchNorm layers in eval mode (running
    statistics frozen) during training; it has no effect on LayerNorm.

    ``init_cfg=dict(type='Pretrained', checkpoint=PATH)`` accepts OpenMMLab checkpoints and the
    official releases (weights under ``'model'``), read tensors only (:func:`read_pretrained`),
    resizes resolution-bound tensors and reports missing and unexpected keys. Weights of another
    architecture are an error that names what the file is. A missing file is a warning, not an
    error, so the configs' first command also runs before the ImageNet weights are downloaded.
    """

    #: random initialisation used when ``init_cfg`` is None (and when a pretrained file is missing)
    default_init_cfg = [
        dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
        dict(type='Constant', layer=['LayerNorm', 'GroupNorm', '_BatchNorm'], val=1., bias=0.),
    ]

    #: how many stages ``frozen_stages`` counts (blocks for a plain ViT); set on the instance
    #: when the arch decides it
    num_stages = 4

    #: keyword arguments of the official classifier's final LayerNorm (e.g. ``dict(eps=1e-6)``)
    #: that ``final_norm=True`` builds as ``norm``; None where the official classifier has no
    #: final norm of its own (FLatten-PVT v1 averages raw stage-4 tokens, PVTv2's ``norm4`` is a
    #: stage norm, CARE normalises inside its head)
    final_norm_cfg = None

    def __init__(self, frozen_stages=-1, norm_eval=False, init_cfg=None, final_norm=False):
        if init_cfg is None:
            init_cfg = copy.deepcopy(self.default_init_cfg)
        super().__init__(init_cfg=init_cfg)
        if final_norm and self.final_norm_cfg is None:
            raise ValueError(f'{type(self).__name__} has no final_norm option: its official '
                             'classifier has no final norm of its own')
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.final_norm = bool(final_norm)

    # -- classification ----------------------------------------------------------------------
    def out_norm_layer(self, channels):
        """The LayerNorm ``norm{i}`` of a dense output; an identity with ``final_norm``."""
        return nn.Identity() if self.final_norm else LayerNormFP32(channels)

    def add_final_norm(self, channels):
        """Build the official final norm ``norm`` when ``final_norm`` is set (after the stages).

        It normalises the channels of the last output (:func:`_apply_final_norm`), which must
        be the last stage's.
        """
        if not self.final_norm:
            return
        if self.num_stages - 1 not in self.out_indices:
            raise ValueError(f'final_norm=True normalises the last stage, so out_indices must '
                             f'contain {self.num_stages - 1}, got {tuple(self.out_indices)}')
        self.norm = LayerNormFP32(channels, **self.final_norm_cfg)
        self.register_forward_hook(_apply_final_norm)

    def forward_raw(self, x):
        """The outputs of :meth:`forward` without the final norm.

        ``forward`` is called directly, so no forward hook of this module runs (the final norm is
        one): timm's ``forward_intermediates`` returns stage features before the final norm.
        """
        return self.forward(x)

    # -- freezing ----------------------------------------------------------------------------
    def stage_modules(self, index):
        """Modules (and parameters) of stage ``index`` (0-based); ``-1`` means the stem."""
        raise NotImplementedError

    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        if self.frozen_stages > self.num_stages:
            raise ValueError(f'frozen_stages={self.frozen_stages} but the model has '
                             f'{self.num_stages} stages')
        for index in range(-1, self.frozen_stages):
            items = list(self.stage_modules(index))
            if index == self.num_stages - 1 and self.final_norm:
                items.append(getattr(self, 'norm', None))  # freezing every stage freezes it
            for item in items:
                if isinstance(item, nn.Module):
                    item.eval()
                    for p in item.parameters():
                        p.requires_grad = False
                elif item is not None:
                    item.requires_grad = False

    def train(self, mode=True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    # -- pretrained weights ------------------------------------------------------------------
    #: prefixes stripped from every checkpoint key, in this order (raw training files)
    ckpt_strip_prefixes = ()
    #: checkpoint keys this backbone does not build (classifier heads, final norms), by prefix;
    #: a key the backbone does build is kept (the final ``norm`` with ``final_norm=True``)
    ckpt_drop_prefixes = ('head.', )
    #: ... and by suffix (e.g. fixed-size ``attn_mask`` buffers)
    ckpt_drop_suffixes = ()
    #: leaf names (or their beginnings) of buffers that depend only on this model's geometry
    #: (index tables): never read from a checkpoint, always this model's own values
    ckpt_own_leaves = ()
    #: ``(regex on the key, rule[, options])`` for tensors whose shape differs from this model's;
    #: the first match applies ``_resize_<rule>``: ``'token_grid'`` (``(1, [P +] H*W, C)``
    #: position tensors) or ``'bias_table'`` (relative-position tables)
    ckpt_resize_rules = ()
    #: ``(official prefix, classifier prefix)`` pairs: where the tensors of an official
    #: classification head go in mmpretrain's ``ImageClassifier`` (and mmeffvit's timm models)
    ckpt_cls_head_prefixes = (('head.', 'head.fc.'), )

    def strip_ckpt_prefixes(self, key):
        for prefix in self.ckpt_strip_prefixes:
            if key.startswith(prefix):
                key = key[len(prefix):]
        return key

    def convert_weights(self, state_dict):
        """Map a checkpoint's weights onto this model, as the ``ckpt_*`` attributes declare.

        Strips ``ckpt_strip_prefixes``, drops ``ckpt_drop_prefixes`` (keys this model does not
        build) and ``ckpt_drop_suffixes``, resizes every tensor whose shape differs from this
        model's by the first matching ``ckpt_resize_rules`` entry (the others stay as they are:
        ``init_weights`` reports them) and, when anything matched, takes ``ckpt_own_leaves``
        buffers from this model.
        """
        own = self.state_dict()
        out = {}
        for key, value in state_dict.items():
            key = self.strip_ckpt_prefixes(key)
            if ((key.startswith(self.ckpt_drop_prefixes) and key not in own)
                    or key.endswith(self.ckpt_drop_suffixes) or self._own_leaf(key)):
                continue
            target = own.get(key)
            if target is not None and target.shape != value.shape:
                value = self._resize(key, value, target)
            out[key] = value
        if self.ckpt_own_leaves and any(k in own for k in out):
            # e.g. index buffers, which some official loaders delete before saving
            out.update({k: v.clone() for k, v in own.items() if self._own_leaf(k)})
        return out

    def convert_classifier_weights(self, state_dict):
        """An official classification checkpoint → the keys of the classifier built on this model.

        The head's tensors move by ``ckpt_cls_head_prefixes`` (``head.*`` → ``head.fc.*`` for a
        linear head), everything else goes through :meth:`convert_weights` under ``backbone.``.
        Build the model with ``final_norm=True`` where the family has the option, so that the
        official final ``norm`` is kept. The result loads into mmpretrain's ``ImageClassifier``
        (``configs/_base_/models/cls_*.py``) and into mmeffvit's timm models.
        """
        head, rest = {}, {}
        for key, value in state_dict.items():
            key = self.strip_ckpt_prefixes(key)
            for source, target in self.ckpt_cls_head_prefixes:
                if key.startswith(source):
                    head[target + key[len(source):]] = value
                    break
            else:
                rest[key] = value
        out = {'backbone.' + k: v for k, v in self.convert_weights(rest).items()}
        out.update(head)
        return out

    def _own_leaf(self, key):
        return bool(self.ckpt_own_leaves) and key.rsplit('.', 1)[-1].startswith(
            self.ckpt_own_leaves)

    def _resize(self, key, value, target):
        for pattern, rule, *options in self.ckpt_resize_rules:
            if re.search(pattern, key):
                return getattr(self, f'_resize_{rule}')(key, value, target, **dict(*options))
        return value

    def token_grid(self, key):
        """Grid ``(H, W)`` this model stores the token tensor ``key`` for.

        ``pos_embed`` / ``pos_embed{i}`` are the backbone's own position embeddings (grids
        ``pos_grid`` / ``pos_grids[i - 1]``); any other tensor belongs to a module whose
        ``pe_size`` is its grid (:class:`FocusedLinearAttention`).
        """
        stage = re.fullmatch(r'pos_embed(\d*)', key)
        if stage:
            return self.pos_grids[int(stage[1]) - 1] if stage[1] else self.pos_grid
        return tuple(self.get_submodule(key.rsplit('.', 1)[0]).pe_size)

    def _resize_token_grid(self, key, value, target, ckpt_prefix=()):
        """``(1, P + H*W, C)`` tokens of a square grid → :meth:`token_grid` (bicubic).

        ``P`` leading tokens (cls, distillation) are allowed when ``P`` is in ``ckpt_prefix``;
        the model keeps as many of them as it has prefix slots (``target``) and drops the rest.
        """
        if value.dim() != 3 or value.shape[-1] != target.shape[-1]:
            return value
        grid = self.token_grid(key)
        extra = value.shape[1] - math.isqrt(value.shape[1]) ** 2
        extra = extra if extra in ckpt_prefix else 0
        side = square_side(value.shape[1] - extra, key)
        tokens = resize_token_grid(value[:, extra:], (side, side), grid, mode='bicubic')
        keep = target.shape[1] - grid[0] * grid[1]
        return torch.cat([value[:, :keep], tokens], dim=1) if keep else tokens

    def _resize_bias_table(self, key, value, target, transposed=False):
        """A ``((2w-1)², h)`` relative-position table (``(h, L)`` when ``transposed``) →
        this model's number of offsets (bicubic on the square offset grid)."""
        heads = 0 if transposed else 1
        if value.dim() != 2 or value.shape[heads] != target.shape[heads]:
            return value
        if transposed:
            return resize_bias_table(value.t(), target.shape[1], key).t()
        return resize_bias_table(value, target.shape[0], key)

    def init_random_extras(self):
        """Initialise what ``init_cfg`` layer rules cannot reach (e.g. position embeddings)."""

    def _init_random(self):
        super().init_weights()
        self.init_random_extras()

    def init_weights(self):
        cfg = self.init_cfg
        if not (isinstance(cfg, dict) and cfg.get('type') == 'Pretrained'):
            self._init_random()
            return
        path = cfg.get('checkpoint')
        if path is None:
            raise ValueError("init_cfg type='Pretrained' needs a 'checkpoint' path")
        try:
            ckpt = read_pretrained(path)
        except FileNotFoundError:
            print_log(
                f'{type(self).__name__}: pretrained checkpoint {path} not found; the backbone '
                'keeps its random initialisation (expect much lower accuracy). Download the '
                'official ImageNet weights to that path, or set model.backbone.init_cfg=None '
                'to train from scratch without this warning.', logger='current', level=30)
            self.init_cfg = copy.deepcopy(self.default_init_cfg)
            self._init_random()
            return
        state_dict = unwrap_state_dict(ckpt, prefix=cfg.get('prefix'))
        about = dict(source=f'checkpoint {path}', is_backbone=True,
                     meta_text=describe_meta(ckpt.get('meta')))
        try:
            state_dict = self.convert_weights(state_dict)
        except (KeyError, ValueError, RuntimeError, IndexError) as err:
            check_fit(self, state_dict, **about)  # names the file when it is another backbone
            raise RuntimeError(f'{type(self).__name__}: cannot convert the weights of {path} '
                               f'({type(err).__name__}: {err})') from err
        report = check_fit(self, state_dict, **about)
        result = self.load_state_dict(state_dict, strict=False)
        print_log(f'{type(self).__name__}: {report.line()} from {path}; missing: '
                  f'{result.missing_keys or "none"}; unexpected: '
                  f'{result.unexpected_keys or "none"}', logger='current')
        self._is_init = True


def _apply_final_norm(backbone, args, outs):
    """Forward hook of a backbone built with ``final_norm=True``: its final ``norm`` over the
    channels of the last output map (the last stage's, see :meth:`EffBackbone.add_final_norm`).

    A module-level function of the module it is called with (no closure), so copies of the
    model (EMA, ``deepcopy``) normalise with their own ``norm``.
    """
    last = backbone.norm(outs[-1].permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    return tuple(outs[:-1]) + (last.contiguous(), )


def read_pretrained(path):
    """The tensors of a pretrained checkpoint (local path or URL), read without running code.

    http(s) files are downloaded to torch's hub cache and read, like local files, with the
    tensors-only reader (official training files hold argparse / yacs objects); other schemes
    (``torchvision://``, ``open-mmlab://`` ...) go through mmengine's loaders, which mmeffvit
    routes through its safe reader.
    """
    path = str(path)
    if path.startswith(('http://', 'https://')):
        path = download_checkpoint(path)
    elif '://' in path:
        from mmengine.runner import CheckpointLoader
        return CheckpointLoader.load_checkpoint(path, map_location='cpu')
    return load_checkpoint_file(path, tensors_only=True)
