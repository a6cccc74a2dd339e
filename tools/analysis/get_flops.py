"""Parameters and GMACs of an mmdet / mmseg config's model or of a bare mmeffvit backbone.

1 MAC = one multiply-add (fvcore / mmengine convention); papers, FLatten's included, call these
"FLOPs". Linear layers, convolutions and every attention product are counted (focused linear
attention's ``q·mean(k)``, ``KᵀV``, ``Q(KᵀV)`` and depthwise conv; softmax attention's
``QKᵀ`` and ``AV``, also through ``F.scaled_dot_product_attention``); element-wise work (the
focusing function, softmax, norms, activations, pooling, resizing) is not, unless
``--count-elementwise`` asks for mmengine's default charges. See
:mod:`mmeffvit.analysis`. Examples::

    # a config's model: backbone + neck + heads in tensor mode (mmdet default 1280x800,
    # mmseg 2048x512, given as --shape H W)
    python tools/analysis/get_flops.py configs/mask_rcnn_flatten_pvt_t_1x.py
    python tools/analysis/get_flops.py configs/flatten/upernet_flatten_swin_t_160k_ade20k.py \
        --shape 512 512
    # a bare backbone, or its official ImageNet classifier
    python tools/analysis/get_flops.py --backbone FLattenSwin --arch tiny --shape 224 224
    python tools/analysis/get_flops.py --backbone FLattenSwin --arch tiny --with-head --debug
"""
import argparse
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if sys.path[0] != REPO_ROOT:
    sys.path.insert(0, REPO_ROOT)

from mmengine.config import DictAction  # noqa: E402

import mmeffvit  # noqa: E402,F401  registers the backbones
from mmeffvit.analysis import (backbone_complexity, config_complexity,  # noqa: E402
                               format_report)


def build_parser():
    """Return the argument parser of the tool."""
    parser = argparse.ArgumentParser(
        description='Count parameters and GMACs (multiply-adds, "FLOPs" in papers)')
    parser.add_argument('config', nargs='?', help='mmdet / mmseg config (or use --backbone)')
    parser.add_argument('--backbone', help='registered backbone name, e.g. FLattenSwin')
    parser.add_argument('--arch', help='backbone variant, e.g. tiny or b0')
    parser.add_argument(
        '--shape', type=int, nargs='+', metavar='SIZE',
        help='input size "H W" (or one number for a square); default: 224 224 for a backbone, '
        '800 1280 for mmdet configs, 512 2048 for mmseg configs')
    parser.add_argument(
        '--with-head', action='store_true',
        help='with --backbone: count the official ImageNet classification model (final norm, '
        'global pooling, Linear(C, 1000))')
    parser.add_argument(
        '--backbone-options', nargs='+', action=DictAction, default={},
        help='with --backbone: more constructor arguments, key=value')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='with a config: override settings, key=value (as tools/train.py)')
    parser.add_argument(
        '--count-elementwise', action='store_true',
        help="use mmengine's default charges for norms, resizing and pooling too (what the "
        "toolboxes' own get_flops report)")
    parser.add_argument(
        '--debug', action='store_true',
        help='print MACs per operator and module, unsupported operators and uncalled modules')
    return parser


def _shape(values, default):
    if not values:
        return default
    if len(values) == 1:
        return (values[0], values[0])
    if len(values) == 2:
        return tuple(values)
    raise SystemExit(f'--shape takes one or two numbers, got {values}')


def _module_lines(report, roots, depth=2):
    """MACs of the modules up to ``depth`` levels below each root, largest first."""
    lines = []
    for name, macs in sorted(report.by_module.items(), key=lambda kv: -kv[1]):
        level = name.count('.') + 1 if name else 0
        inside = any(not r or name == r or name.startswith(r + '.') for r in roots)
        if macs and inside and level <= depth:
            lines.append(f'  {name or "<model>":40s} {macs / 1e9:10.3f} GMACs')
    return lines


def run_backbone(args):
    """Count a bare backbone (or its classifier); return the printed lines."""
    shape = _shape(args.shape, (224, 224))
    report = backbone_complexity(args.backbone, args.arch, shape, args.with_head,
                                 args.count_elementwise, **args.backbone_options)
    what = 'ImageNet classifier' if args.with_head else 'backbone'
    lines = format_report(report, f'{args.backbone} {args.arch or ""} ({what})', args.debug)
    if args.debug:
        lines.append('MACs by module:')
        lines += _module_lines(report, [''], depth=2)
    return lines


def run_config(args):
    """Count a config's model; return the printed lines."""
    from mmengine.config import Config
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    shape = _shape(args.shape, None)
    report, summary = config_complexity(cfg, shape, args.count_elementwise)
    lines = format_report(report, f'{args.config} ({summary["scope"]}, tensor mode)', args.debug)
    if summary['input_shape'] != summary['shape']:
        lines.append(f'(the data preprocessor padded {summary["shape"]} to '
                     f'{summary["input_shape"]})')
    for part, macs in sorted(summary['parts'].items(), key=lambda kv: -kv[1]):
        params = summary['part_params'].get(part, 0)
        lines.append(f'  {part:16s} {macs / 1e9:9.2f} GMACs {params / 1e6:8.2f} M params '
                     f'({macs:,} MACs)')
    if args.debug:
        lines.append('MACs by module:')
        lines += _module_lines(report, ['model.backbone', 'model.neck'], depth=3)
    return lines


def main(argv=None):
    """Entry point; returns the printed lines (used by the tests)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.config is None) == (args.backbone is None):
        parser.error('give either a config or --backbone NAME')
    if args.config is None:
        lines = run_backbone(args)
    else:
        if args.with_head or args.backbone_options or args.arch:
            parser.error('--arch, --with-head and --backbone-options go with --backbone')
        lines = run_config(args)
    lines.append('Only multiply-adds of linear layers, convolutions and attention products are '
                 'counted (element-wise work is not); check the input shape before comparing.')
    print('\n'.join(lines))
    return lines


if __name__ == '__main__':
    main()
