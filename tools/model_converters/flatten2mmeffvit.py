"""Convert an official FLatten-Transformer ImageNet checkpoint to an mmeffvit backbone checkpoint.

The official training files hold the weights under ``'model'`` (CSWin's EMA copy under
``'state_dict_ema'``, chosen with ``--ema``) next to optimizer state and yacs / argparse objects;
they are read with mmeffvit's tensors-only reader (``load_checkpoint_file(tensors_only=True)``),
which never calls what those objects would need and keeps only the tensors; files that would run
code are refused (``--trust-checkpoint`` unpickles a file you trust in full). The weights go
through the backbone's own ``convert_weights`` (classifier and final norm dropped, position
tensors resized to ``--img-size``) and are checked by loading them into the backbone. The output
is an mmengine-style checkpoint::

    {'state_dict': {'backbone.<name>': tensor, ...}, 'meta': {...}}

usable as a backbone's ``init_cfg=dict(type='Pretrained', checkpoint=DST)``, as a detector's
``load_from`` (only the backbone is filled) or with mmengine's ``load_checkpoint``. Family, arch
and pre-training size are inferred from the weights when not given. Examples::

    python tools/model_converters/flatten2mmeffvit.py flatten_pvt_t.pth checkpoints/pvt_t.pth
    python tools/model_converters/flatten2mmeffvit.py flatten_swin_b_384.pth out.pth \\
        --family swin --arch base --img-size 384
"""
import argparse
import os
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if sys.path[0] != REPO_ROOT:
    sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402

import mmeffvit  # noqa: E402  registers the backbones
from mmeffvit.models import (FLattenCSWin, FLattenDeiT, FLattenPVT,  # noqa: E402
                             FLattenPVTv2, FLattenSwin)
from mmeffvit.utils.checkpoint import (add_trust_argument,  # noqa: E402
                                       apply_trust_argument, load_checkpoint_file,
                                       unwrap_state_dict)

#: family -> (backbone class, a key only that family's checkpoints have, the key whose token
#: count gives the pre-training size, that tensor's patch stride)
FAMILIES = {
    'pvt': (FLattenPVT, 'pos_embed1', 'pos_embed1', 4),
    'pvt_v2': (FLattenPVTv2, 'block1.0.mlp.dwconv.dwconv.weight',
               'block1.0.attn.positional_encoding', 4),
    'swin': (FLattenSwin, 'layers.0.blocks.0.norm1.weight',
             'layers.0.blocks.0.attn.positional_encoding', 4),
    'cswin': (FLattenCSWin, 'stage1_conv_embed.0.weight', 'stage1.0.attns.0.positional_encoding',
              4),
    'deit': (FLattenDeiT, 'cls_token', 'pos_embed', 16),
}


def detect_family(state_dict):
    """The family whose marker key the weights hold (PVTv2 is checked before PVT)."""
    for family in ('pvt_v2', 'cswin', 'swin', 'deit', 'pvt'):
        if FAMILIES[family][1] in state_dict:
            return family
    raise ValueError('cannot tell the FLatten family of this checkpoint (first keys: '
                     f'{list(state_dict)[:6]}); pass --family')


def infer_img_size(family, state_dict):
    """Pre-training resolution from a position tensor, or None when the weights lack it."""
    key, stride = FAMILIES[family][2], FAMILIES[family][3]
    value = state_dict.get(key)
    if value is None or value.dim() != 3:
        return None
    tokens = value.shape[1]
    side = int(tokens ** 0.5)  # DeiT's pos_embed has cls (and distillation) slots on top
    return side * stride


def infer_window(state_dict):
    """Swin's softmax window from a ``(2w-1)² × h`` relative bias table, or None."""
    for key, value in state_dict.items():
        if key.endswith('relative_position_bias_table'):
            side = int(round(value.shape[0] ** 0.5))
            return (side + 1) // 2
    return None


def _build(cls, kwargs, meta_ok=True):
    """The backbone, on the meta device when its constructor allows it (shapes only)."""
    if meta_ok:
        try:
            with torch.device('meta'):
                return cls(**kwargs)
        except (NotImplementedError, RuntimeError):
            pass
    return cls(**kwargs)


def _fit(model, state_dict):
    """``(converted, missing, unexpected, mismatched, resized)`` of ``state_dict`` in ``model``."""
    converted = model.convert_weights(state_dict)
    own = model.state_dict()
    missing = [k for k in own if k not in converted]
    unexpected = [k for k in converted if k not in own]
    mismatched = [k for k in converted if k in own and converted[k].shape != own[k].shape]
    resized = [k for k in converted if k in state_dict and converted[k].shape
               != state_dict[k].shape]
    return converted, missing, unexpected, mismatched, resized


def choose_arch(cls, state_dict, base_kwargs, arch=None):
    """The arch (given, or the best-fitting one) and the model built for it (maybe on 'meta').

    Candidates are ranked by shape mismatches, then missing keys, then resized tensors (so a
    384² release picks CSWin's ``base_384`` over ``base``); a candidate whose conversion fails
    is skipped.
    """
    names = [arch] if arch else list(cls.arch_settings)
    ranked = []
    for name in names:
        try:
            model = _build(cls, dict(base_kwargs, arch=name))
            fit = _fit(model, state_dict)
        except (ValueError, RuntimeError, AssertionError, KeyError) as err:
            if arch:
                raise
            print(f'  arch {name}: does not fit ({type(err).__name__})')
            continue
        ranked.append(((len(fit[3]), len(fit[1]), len(fit[4])), name, model))
    if not ranked:
        raise ValueError(f'no {cls.__name__} arch fits these weights; pass --arch')
    ranked.sort(key=lambda item: item[0])
    score, name, model = ranked[0]
    if score[0]:
        raise ValueError(f'{cls.__name__} arch {name!r} does not fit these weights: shapes differ '
                         f'for {_fit(model, state_dict)[3][:5]}')
    return name, model


def convert(src, dst, family=None, arch=None, img_size=None, ema=False, verbose=True):
    """Convert ``src`` (official FLatten release) to ``dst`` (mmengine-style backbone file).

    Args:
        src (str): Official checkpoint.
        dst (str): Output path (its directory is created).
        family (str, optional): ``pvt``, ``pvt_v2``, ``swin``, ``cswin`` or ``deit``; inferred.
        arch (str, optional): Variant of the family; inferred from the shapes.
        img_size (int, optional): Pre-training size of the target backbone (its position
            tensors are resized to it); default: that of the checkpoint.
        ema (bool): Use the EMA weights (``'state_dict_ema'``) when the file has them.

    Returns:
        dict: The ``meta`` written, with the missing and unexpected keys.
    """
    ckpt = load_checkpoint_file(src, tensors_only=True)
    if ema:
        if not (isinstance(ckpt, dict) and 'state_dict_ema' in ckpt):
            raise KeyError(f'{src} holds no state_dict_ema')
        ckpt = ckpt['state_dict_ema']
    state_dict = unwrap_state_dict(ckpt)
    family = family or detect_family(state_dict)
    if family not in FAMILIES:
        raise ValueError(f'unknown family {family!r}; choose from {sorted(FAMILIES)}')
    cls = FAMILIES[family][0]
    kwargs = {}
    size = img_size or infer_img_size(family, state_dict)
    if size is not None and not (family == 'cswin' and img_size is None):
        kwargs['pretrain_img_size'] = size  # CSWin's archs carry their own size and stripes
    if family == 'swin':
        window = infer_window(state_dict)
        if window:
            kwargs['window_size'] = window
    arch, model = choose_arch(cls, state_dict, kwargs, arch)
    if any(t.is_meta for t in model.state_dict().values()):
        model = cls(arch=arch, **kwargs)  # real tensors: the weights are loaded for the check
    converted, missing, unexpected, mismatched, resized = _fit(model, state_dict)
    kept = {k: v.detach().clone().contiguous() for k, v in converted.items()
            if k in model.state_dict()}
    model.load_state_dict(kept, strict=False)
    dropped = sorted(set(state_dict) - set(converted))
    meta = dict(
        converted_from=osp.basename(src), converter='tools/model_converters/flatten2mmeffvit.py',
        mmeffvit_version=mmeffvit.__version__, family=family, type=cls.__name__,
        backbone=dict(type=cls.__name__, arch=arch, **kwargs), missing_keys=missing,
        unexpected_keys=unexpected, dropped_keys=dropped, resized_keys=resized)
    os.makedirs(osp.dirname(osp.abspath(dst)), exist_ok=True)
    torch.save({'state_dict': {'backbone.' + k: v for k, v in kept.items()}, 'meta': meta}, dst)
    if verbose:
        print(f'{src} -> {dst}: {cls.__name__} arch={arch!r} {kwargs}, {len(kept)} tensors')
        print(f'  dropped (classifier / fixed-size buffers): {dropped or "none"}')
        print(f'  resized: {resized or "none"}')
        print(f'  missing in the checkpoint (keep their initialisation): {missing or "none"}')
        print(f'  unexpected (not written): {unexpected or "none"}')
    return meta


def main(argv=None):
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description='Official FLatten-Transformer checkpoint -> mmeffvit backbone checkpoint')
    parser.add_argument('src', help='official checkpoint (weights under "model")')
    parser.add_argument('dst', help='output file')
    parser.add_argument('--family', choices=sorted(FAMILIES), help='default: inferred')
    parser.add_argument('--arch', help='variant, e.g. tiny or b0 (default: inferred)')
    parser.add_argument('--img-size', type=int,
                        help='pre-training size of the converted backbone (default: the '
                        "checkpoint's; other sizes resize the position tensors)")
    parser.add_argument('--ema', action='store_true', help='convert state_dict_ema')
    add_trust_argument(parser)
    args = parser.parse_args(argv)
    apply_trust_argument(args)
    return convert(args.src, args.dst, args.family, args.arch, args.img_size, args.ema)


if __name__ == '__main__':
    main()
