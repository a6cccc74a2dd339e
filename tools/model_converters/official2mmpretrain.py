"""Convert an official ImageNet classification checkpoint to an mmpretrain classifier checkpoint.

The classifier is the model of an mmpretrain config (``configs/_base_/models/cls_*.py`` or a
recipe config that takes one): its backbone's ``convert_classifier_weights`` maps the file, which
is read with mmeffvit's tensors-only reader (official training files hold argparse / yacs
objects; a file that would run code is refused unless ``--trust-checkpoint``), onto
``backbone.*`` (official names, the final ``norm`` included, position tensors resized) and the
head (``head.*`` → ``head.fc.*``; CARE's two heads → ``head.{norm,fc,dist_norm,dist_fc}``). The
result is loaded into the classifier as a check (every tensor of the classifier must come from
the file) and written as ``{'state_dict': ..., 'meta': ...}``, usable as ``load_from`` of
``tools/train.py`` / ``tools/test.py`` or, for a detector, as
``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``. Examples::

    python tools/model_converters/official2mmpretrain.py \\
        configs/_base_/models/cls_flatten_swin_t.py flatten_swin_t.pth checkpoints/swin_t_cls.pth
    python tools/model_converters/official2mmpretrain.py \\
        configs/_base_/models/cls_care_s0.py CARETrans_S0.pth.tar checkpoints/care_s0_cls.pth

A config with another number of classes keeps its own head (``--keep-head`` is then implied and
said); ``--ema`` converts the EMA weights of a file that has them.
"""
import argparse
import os
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if sys.path[0] != REPO_ROOT:
    sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

import mmeffvit  # noqa: E402  registers the backbones, heads and classifiers
from mmeffvit.utils.checkpoint import (add_trust_argument,  # noqa: E402
                                       apply_trust_argument, load_checkpoint_file,
                                       unwrap_state_dict)

#: where official files keep EMA weights (CSWin / timm: state_dict_ema, ConvNeXt-style: model_ema)
EMA_KEYS = ('state_dict_ema', 'model_ema')


def build_classifier(config, cfg_options=None):
    """The mmpretrain classifier of ``config`` (random weights; nothing is loaded)."""
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if 'model' not in cfg:
        raise KeyError(f'{config} defines no model')
    init_default_scope(cfg.get('default_scope', 'mmpretrain'))
    from mmpretrain.registry import MODELS
    model = MODELS.build(cfg.model)
    if not hasattr(getattr(model, 'backbone', None), 'convert_classifier_weights'):
        raise TypeError(f'the backbone of {config} is not an mmeffvit backbone '
                        f'({type(getattr(model, "backbone", None)).__name__})')
    return model


def official_weights(src, ema=False):
    """The ``{name: tensor}`` weights of an official file (``ema``: its EMA copy)."""
    ckpt = load_checkpoint_file(src, tensors_only=True)
    if ema:
        found = [k for k in EMA_KEYS if isinstance(ckpt, dict) and isinstance(ckpt.get(k), dict)]
        if not found:
            raise KeyError(f'{src} holds no EMA weights (looked for {EMA_KEYS})')
        ckpt = ckpt[found[0]]
    return unwrap_state_dict(ckpt)


def convert(config, src, dst, ema=False, cfg_options=None, verbose=True):
    """Convert ``src`` for the classifier of ``config`` and write ``dst``; return the meta.

    Raises:
        RuntimeError: the converted weights do not fill the classifier (names or shapes).
    """
    model = build_classifier(config, cfg_options)
    weights = official_weights(src, ema)
    converted = model.backbone.convert_classifier_weights(weights)
    own = model.state_dict()
    kept_head = []
    for key in [k for k in converted if k.startswith('head.')]:
        if key in own and converted[key].shape != own[key].shape:
            kept_head.append(key)  # another number of classes: the config's head stays
            del converted[key]
    mismatched = [k for k in converted if k in own and converted[k].shape != own[k].shape]
    unexpected = [k for k in converted if k not in own]
    missing = [k for k in own if k not in converted and k not in kept_head
               and not k.startswith('data_preprocessor.')]
    if mismatched or unexpected or missing:
        raise RuntimeError(
            f'{src} does not fit the classifier of {config}: shapes differ for '
            f'{mismatched[:5] or "none"}; not in the classifier: {unexpected[:5] or "none"}; '
            f'not in the file: {missing[:5] or "none"} ({len(missing)} in all)')
    state_dict = {k: v.detach().clone().contiguous() for k, v in converted.items()}
    model.load_state_dict(state_dict, strict=False)
    backbone_keys = model.backbone.state_dict()
    dropped = sorted(k for k in weights if not _lands(model.backbone, k, backbone_keys, own))
    meta = dict(converted_from=osp.basename(src),
                converter='tools/model_converters/official2mmpretrain.py',
                mmeffvit_version=mmeffvit.__version__, config=config,
                backbone=type(model.backbone).__name__, ema=ema, dropped_keys=dropped,
                kept_head=kept_head)
    os.makedirs(osp.dirname(osp.abspath(dst)), exist_ok=True)
    torch.save({'state_dict': state_dict, 'meta': meta}, dst)
    if verbose:
        print(f'{src} -> {dst}: {type(model).__name__} with {meta["backbone"]}, '
              f'{len(state_dict)} tensors')
        print(f'  dropped (not in the classifier): {meta["dropped_keys"] or "none"}')
        if kept_head:
            print(f'  the config has another number of classes: its head keeps its '
                  f'initialisation ({kept_head})')
    return meta


def _lands(backbone, key, backbone_keys, own):
    """Whether the official ``key`` has a place in the classifier (backbone or head)."""
    key = backbone.strip_ckpt_prefixes(key)
    return key in backbone_keys or any(
        key.startswith(source) and target + key[len(source):] in own
        for source, target in backbone.ckpt_cls_head_prefixes)


def main(argv=None):
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description='Official ImageNet classification checkpoint -> mmpretrain classifier')
    parser.add_argument('config', help='mmpretrain config whose model receives the weights')
    parser.add_argument('src', help='official checkpoint')
    parser.add_argument('dst', help='output file')
    parser.add_argument('--ema', action='store_true', help='convert the EMA weights')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of the config (e.g. model.head.num_classes=10)')
    add_trust_argument(parser)
    args = parser.parse_args(argv)
    apply_trust_argument(args)
    return convert(args.config, args.src, args.dst, args.ema, args.cfg_options)


if __name__ == '__main__':
    main()
