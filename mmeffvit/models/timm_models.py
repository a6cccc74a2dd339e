"""timm entry points of mmeffvit's backbones under the names of their official code.

``import mmeffvit`` registers them with timm, so ``timm.list_models('flatten_*')`` lists the
FLatten models and ``timm.create_model(name, ...)`` builds :class:`BackboneClassifier`: an
mmeffvit backbone (its official classifier layout: ``final_norm`` where the official classifier
has a final norm, the official window settings) followed by timm's ``ClassifierHead`` (global
average pooling, dropout, linear) or, for CARE, :class:`~mmeffvit.models.heads.CAREHead`. No
block is implemented twice: the backbone is the one the mmdet / mmseg / mmpretrain configs use.
Parameter names equal those of mmpretrain's ``ImageClassifier`` built from
``configs/_base_/models/cls_*.py`` (``backbone.*``, ``head.fc.*``), so one state dict serves both.

What timm users expect:

* ``pretrained=True, pretrained_cfg_overlay=dict(file=PATH)`` loads an official release file
  (or an mmpretrain / timm checkpoint of these models) through mmeffvit's tensors-only reader
  (``custom_load``: timm's own loader is not used; a file that would run code is refused) and
  converts it (:meth:`BackboneClassifier.load_pretrained`). Another ``num_classes`` drops the
  file's classifier. No weights are hosted: without a file ``pretrained=True`` is timm's error.
* ``features_only=True`` (timm's ``FeatureGetterNet``): the four stage maps, strides 4-32,
  before the final norm; ``out_indices`` selects them.
* ``num_classes=0``: pooled features; ``global_pool=''`` with ``num_classes=0``: the
  unpooled last map; ``reset_classifier``, ``forward_features``, ``forward_head``,
  ``forward_intermediates``.
* ``pretrained_cfg``: input size, ImageNet mean / std, bicubic, ``crop_pct`` of the official
  evaluation (resize 256/224 then centre crop; 384² models are evaluated uncropped).

Where each name comes from is in :data:`MODEL_SOURCES`.
"""
import copy
import logging

import torch.nn as nn
from mmengine.logging import print_log
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import ClassifierHead
from timm.models import (adapt_input_conv, build_model_with_cfg, generate_default_cfgs,
                         resolve_pretrained_cfg)
from timm.models import register_model as timm_register_model
from timm.models._features import feature_take_indices

from ..registry import MODELS
from ..utils.checkpoint import load_checkpoint_file, unwrap_state_dict
from .heads import CAREHead

_FLATTEN = 'https://github.com/LeapLabTHU/FLatten-Transformer'
_FOCAL = 'https://github.com/microsoft/Focal-Transformer'
_L2VIT = 'https://github.com/ChuanyangZheng/L2ViT'
_CARE = 'https://github.com/zhouyuan888888/CARE-Transformer'


class BackboneClassifier(nn.Module):
    """An mmeffvit backbone as a timm classifier: backbone → (final norm) → pooling → head.

    Args:
        backbone (dict): Config of the mmeffvit backbone (``type`` and arguments); it is built
            with all stages as outputs and ``in_channels=in_chans``.
        num_classes (int): Classes; 0 removes the classifier (pooled features).
        in_chans (int): Input channels.
        global_pool (str): ``'avg'`` or ``''`` (no pooling, needs ``num_classes=0``), or another
            pooling of timm's ``SelectAdaptivePool2d``.
        drop_rate (float): Dropout before the classifier.
        drop_path_rate (float, optional): Stochastic depth of the backbone (default: the
            official training value of the variant, in its backbone config).
        head (str): ``'linear'`` (timm's ``ClassifierHead``) or ``'care'`` (:class:`CAREHead`).
        **kwargs: Further backbone arguments (e.g. ``window_size``).
    """

    def __init__(self, backbone, num_classes=1000, in_chans=3, global_pool='avg', drop_rate=0.,
                 drop_path_rate=None, head='linear', **kwargs):
        super().__init__()
        if head not in ('linear', 'care'):
            raise ValueError(f"head must be 'linear' or 'care', got {head!r}")
        self._check_head(num_classes, global_pool)
        cfg = dict(backbone, in_channels=in_chans, **kwargs)
        if drop_path_rate is not None:
            cfg['drop_path_rate'] = drop_path_rate
        cfg['out_indices'] = tuple(range(4))  # forward_intermediates returns every stage
        self.backbone = MODELS.build(cfg)
        if len(self.backbone.out_indices) != 4:
            raise ValueError(f'{cfg["type"]} is not a four-stage backbone')
        self.num_classes, self.in_chans, self.global_pool = num_classes, in_chans, global_pool
        channels = list(getattr(self.backbone, 'out_channels', None) or self.backbone.embed_dims)
        self.num_features = self.head_hidden_size = channels[-1]
        names = {id(m): n for n, m in self.backbone.named_modules()}
        self.feature_info = [
            dict(num_chs=channels[i], reduction=4 * 2**i,
                 module='backbone.' + names[id(self._stage_module(i))]) for i in range(4)]
        if head == 'care':
            self.head = CAREHead(channels[-1], num_classes, global_pool, drop_rate)
        else:
            self.head = ClassifierHead(channels[-1], num_classes, global_pool, drop_rate)

    @staticmethod
    def _check_head(num_classes, global_pool):
        # timm's ClassifierHead would build a Linear that fails on the unpooled map at run time
        if not global_pool and num_classes > 0:
            raise ValueError("global_pool='' (unpooled features) needs num_classes=0")

    def _stage_module(self, index):
        return next(m for m in self.backbone.stage_modules(index) if isinstance(m, nn.Module))

    @property
    def _final_norm(self):
        """The backbone's final norm, or None where the official classifier has none."""
        return self.backbone.norm if getattr(self.backbone, 'final_norm', False) else None

    # -- timm classifier interface -----------------------------------------------------------
    def get_classifier(self):
        return self.head.fc

    def reset_classifier(self, num_classes, global_pool=None):
        self._check_head(num_classes, self.global_pool if global_pool is None else global_pool)
        if global_pool is not None:
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head.reset(num_classes, global_pool)

    def set_grad_checkpointing(self, enable=True):
        if not hasattr(self.backbone, 'with_cp'):
            raise NotImplementedError(
                f'{type(self.backbone).__name__} has no gradient checkpointing')
        self.backbone.with_cp = enable

    def forward_features(self, x):
        """The last stage's map ``(B, C, H, W)``, after the final norm."""
        return self.backbone(x)[-1]

    def forward_head(self, x, pre_logits=False):
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x):
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x, indices=None, norm=False, stop_early=False,
                              output_fmt='NCHW', intermediates_only=False):
        """Stage maps (timm's interface): ``indices`` = last n (int) or a list of stages.

        The maps are taken before the final norm; ``norm=True`` applies it to the last stage's.
        All four stages always run (``stop_early`` has no effect: the backbones have no early
        exit). ``output_fmt`` is ``'NCHW'`` or ``'NHWC'``.
        """
        if output_fmt not in ('NCHW', 'NHWC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        take, _ = feature_take_indices(len(self.feature_info), indices)
        maps = list(self.backbone.forward_raw(x))
        final_norm = self._final_norm
        last = maps[-1]
        if final_norm is not None:
            last = final_norm(last.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()
        picked = [last if i == len(maps) - 1 and norm else maps[i] for i in take]
        if output_fmt == 'NHWC':
            picked = [m.permute(0, 2, 3, 1) for m in picked]
        if intermediates_only:
            return picked
        return last, picked

    def prune_intermediate_layers(self, indices=1, prune_norm=False, prune_head=True):
        """For feature extraction: drop the classifier (and the final norm with
        ``prune_norm``); every stage stays (see :meth:`forward_intermediates`)."""
        take, _ = feature_take_indices(len(self.feature_info), indices)
        if prune_head:
            self.reset_classifier(0, '')
        if prune_norm and self._final_norm is not None:
            self.backbone.norm = nn.Identity()
        return take

    # -- pretrained weights ------------------------------------------------------------------
    def checkpoint_filter_fn(self, state_dict):
        """Weights of an official, mmpretrain or timm file → this model's names and shapes.

        Official files go through the backbone's ``convert_classifier_weights``; files already
        in this layout (``backbone.*``) keep their keys. Classifier tensors whose shape differs
        (another ``num_classes``) are dropped, the stem conv is adapted to ``in_chans``.
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f'a checkpoint must be a dict, got {type(state_dict).__name__}')
        weights = unwrap_state_dict(state_dict, whole_model=True)
        if any(k.startswith('backbone.') for k in weights):
            weights = {k: v for k, v in weights.items() if k.startswith(('backbone.', 'head.'))}
        else:
            weights = self.backbone.convert_classifier_weights(weights)
        own = self.state_dict()
        stem = self.pretrained_cfg.get('first_conv') if hasattr(self, 'pretrained_cfg') else None
        key = f'{stem}.weight' if stem else None
        if key in weights and key in own and weights[key].shape[1] != own[key].shape[1]:
            weights[key] = adapt_input_conv(self.in_chans, weights[key])
        for key in [k for k in weights if k.startswith('head.')]:
            if key not in own or weights[key].shape != own[key].shape:
                del weights[key]  # another classifier (num_classes, dist head) starts fresh
        return weights

    def load_pretrained(self, checkpoint_path):
        """Load ``checkpoint_path`` (timm's ``custom_load``), read without running its code.

        Every tensor of this model must come from the file except a classifier of another
        size; anything else is an error that lists the keys.
        """
        weights = self.checkpoint_filter_fn(load_checkpoint_file(checkpoint_path,
                                                                 tensors_only=True))
        own = self.state_dict()
        mismatched = [k for k in weights if k in own and weights[k].shape != own[k].shape]
        unexpected = [k for k in weights if k not in own]
        missing = [k for k in own if k not in weights and not k.startswith('head.')]
        if mismatched or unexpected or missing:
            raise RuntimeError(
                f'{checkpoint_path} does not fit {self.pretrained_cfg.get("architecture")}: '
                f'shapes differ for {mismatched[:5] or "none"}; not in the model: '
                f'{unexpected[:5] or "none"}; not in the file: {missing[:5] or "none"} '
                f'({len(missing)} in all)')
        fresh = [k for k in own if k not in weights]
        self.load_state_dict(weights, strict=False)
        print_log(f'{self.pretrained_cfg.get("architecture")}: loaded {len(weights)} tensors '
                  f'from {checkpoint_path}' + (f'; {fresh} keep their initialisation '
                                               '(another classifier)' if fresh else ''),
                  logger='current', level=logging.INFO)


def _filter(state_dict, model):
    """timm's ``pretrained_filter_fn`` (used when ``custom_load`` is switched off)."""
    return model.checkpoint_filter_fn(state_dict)


#: entry point name → (backbone config, extra pretrained_cfg, source of the name)
MODEL_SOURCES = {}
_PRETRAINED_CFGS = {}


def _add(name, backbone, source, head='linear', first_conv='backbone.patch_embed.proj', **cfg):
    MODEL_SOURCES[name] = (backbone, head, source)
    pretrained_cfg = dict(
        url='', num_classes=1000, input_size=(3, 224, 224), pool_size=(7, 7), crop_pct=0.875,
        interpolation='bicubic', mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
        first_conv=first_conv, classifier='head.fc', fixed_input_size=False, custom_load=True)
    pretrained_cfg.update(cfg)  # 384² variants: their input size, pool size, crop
    _PRETRAINED_CFGS[name] = pretrained_cfg


_PVT_SRC = f'{_FLATTEN} models/flatten_pvt.py factory (listed in models/build.py)'
for _arch, _dpr in (('tiny', 0.1), ('small', 0.1), ('medium', 0.3), ('large', 0.3)):
    _add(f'flatten_pvt_{_arch}', dict(type='FLattenPVT', arch=_arch, drop_path_rate=_dpr),
         _PVT_SRC, first_conv='backbone.patch_embed1.proj', origin_url=_FLATTEN)
for _i, _dpr in enumerate((0.1, 0.1, 0.1, 0.3, 0.3, 0.3)):
    _add(f'flatten_pvt_v2_b{_i}', dict(type='FLattenPVTv2', arch=f'b{_i}', drop_path_rate=_dpr),
         f'{_FLATTEN} models/flatten_pvt_v2.py @register_model', origin_url=_FLATTEN,
         first_conv='backbone.patch_embed1.proj')
_SWIN = dict(type='FLattenSwin', attn_type='LLSS', official_window_rule=True, final_norm=True)
for _arch, _dpr in (('tiny', 0.2), ('small', 0.3), ('base', 0.5)):
    _add(f'flatten_swin_{_arch}', dict(_SWIN, arch=_arch, window_size=7, drop_path_rate=_dpr),
         f'timm-style name; the official code registers none (cfgs/flatten_swin_{_arch[0]}.yaml '
         f'MODEL.NAME flatten_swin_{_arch}_patch4_224)', origin_url=_FLATTEN)
_add('flatten_swin_base_384', dict(_SWIN, arch='base', window_size=12, pretrain_img_size=384,
                                   drop_path_rate=0.5),
     'timm-style name; the official code registers none (cfgs/flatten_swin_b_384.yaml MODEL.NAME '
     'flatten_swin_base_patch4_384_finetune)', origin_url=_FLATTEN, input_size=(3, 384, 384),
     pool_size=(12, 12), crop_pct=1.0)
_CSWIN = dict(type='FLattenCSWin', attn_types='LLSS', final_norm=True)
for _official, _alias, _arch, _dpr in (
        ('FLatten_CSWin_64_24181_tiny_224', 'flatten_cswin_tiny', 'tiny', 0.2),
        ('FLatten_CSWin_64_24322_small_224', 'flatten_cswin_small', 'small', 0.4),
        ('FLatten_CSWin_96_36292_base_224', 'flatten_cswin_base', 'base', 0.5),
        ('FLatten_CSWin_96_36292_base_384', 'flatten_cswin_base_384', 'base_384', 0.7)):
    _size = dict(input_size=(3, 384, 384), pool_size=(12, 12), crop_pct=1.0) if '384' in _arch \
        else {}
    for _name, _src in ((_official, f'{_FLATTEN} models/flatten_cswin.py factory'),
                        (_alias, f'timm-style alias of {_official}')):
        _add(_name, dict(_CSWIN, arch=_arch, drop_path_rate=_dpr), _src, origin_url=_FLATTEN,
             first_conv='backbone.stage1_conv_embed.0', **_size)
for _size, _dpr in (('Tiny', 0.1), ('Small', 0.1), ('Base', 0.3)):
    _add(f'L2ViT_{_size}', dict(type='L2ViT', arch=_size.lower(), final_norm=True,
                                drop_path_rate=_dpr),
         f'{_L2VIT} classification/models/l2vit.py @register_model', origin_url=_L2VIT,
         first_conv='backbone.downsample_layers.0.proj.proj.0')
_add('L2ViT_Base_384', dict(type='L2ViT', arch='base', window_size=12, final_norm=True,
                            drop_path_rate=0.2),
     f'{_L2VIT} classification/models/l2vit.py @register_model', origin_url=_L2VIT,
     first_conv='backbone.downsample_layers.0.proj.proj.0', input_size=(3, 384, 384),
     pool_size=(12, 12), crop_pct=1.0)
for _arch, _dpr in (('tiny', 0.2), ('small', 0.3), ('base', 0.5)):
    for _conv in (False, True):
        _add(f'focal_{_arch}{"_useconv" if _conv else ""}_patch4_window7_224',
             dict(type='FocalTransformer', arch=_arch, use_conv_embed=_conv,
                  expand_sizes=(3, 3, 3, 0), mask_borders=False, final_norm=True,
                  drop_path_rate=_dpr),
             f'{_FOCAL} configs/*.yaml MODEL.NAME (the official code registers none)',
             origin_url=_FOCAL)
for _i in range(3):
    _add(f'CARETrans_S{_i}', dict(type='CARE', arch=f's{_i}', last_block='expanded',
                                  last_block_drop_path=True, drop_path_rate=0.1),
         f'{_CARE} models/CARETrans.py @register_model', head='care', origin_url=_CARE,
         first_conv='backbone.stem.0', classifier=('head.fc', 'head.dist_fc'))
for _arch, _dpr in (('tiny', 0.1), ('small', 0.1), ('base', 0.3)):
    _add(f'lavit_{_arch}', dict(type='LaViT', arch=_arch, final_norm=True, drop_path_rate=_dpr),
         'timm-style name (no LaViT code is public)', first_conv='backbone.patch_embed1.proj')

default_cfgs = generate_default_cfgs(_PRETRAINED_CFGS)


def _create(name, pretrained=False, **kwargs):
    backbone, head, _ = MODEL_SOURCES[name]
    if pretrained:
        # timm only warns and keeps random weights when a model has no weight source; no
        # weights are hosted for these models, so a missing file is an error here
        cfg = resolve_pretrained_cfg(name, pretrained_cfg=kwargs.get('pretrained_cfg'),
                                     pretrained_cfg_overlay=kwargs.get('pretrained_cfg_overlay'))
        if not (cfg.file or cfg.url or cfg.hf_hub_id or cfg.state_dict):
            raise ValueError(f'{name}: no weights are hosted; pass an official or converted '
                             'file: pretrained_cfg_overlay=dict(file=PATH)')
        # timm resets custom_load when the overlay names a file and would then read it with its
        # own torch.load, which cannot read official training files (argparse / yacs objects);
        # load_pretrained reads the tensors only and converts the names
        kwargs['pretrained_cfg_overlay'] = dict(kwargs.get('pretrained_cfg_overlay') or {},
                                                custom_load=True)
    out_indices = kwargs.pop('out_indices', (0, 1, 2, 3))
    return build_model_with_cfg(
        BackboneClassifier, name, pretrained, backbone=copy.deepcopy(backbone), head=head,
        pretrained_filter_fn=_filter,
        feature_cfg=dict(out_indices=out_indices, feature_cls='getter'), **kwargs)


def _entry_point(name):
    def create(pretrained=False, **kwargs):
        return _create(name, pretrained, **kwargs)

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = f'{name}: {MODEL_SOURCES[name][0]["type"]} ({MODEL_SOURCES[name][2]}).'
    return create


for _name in MODEL_SOURCES:
    globals()[_name] = timm_register_model(_entry_point(_name))
