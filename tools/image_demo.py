"""Run a detector, instance segmenter or semantic segmenter on pictures and draw its predictions.

The toolbox is taken from the config's ``default_scope``: mmdet configs run through mmdet's
``DetInferencer``, mmseg configs through mmseg's ``MMSegInferencer``, and the pictures are drawn
by their visualizers. Examples::

    python tools/image_demo.py demo.jpg CONFIG CHECKPOINT                 # -> outputs/vis/demo.jpg
    python tools/image_demo.py photos/ CONFIG CHECKPOINT --out-dir preds --score-thr 0.5
    python tools/image_demo.py sample:astronaut CONFIG CHECKPOINT   # a photo scikit-image ships
    python tools/image_demo.py sample:all configs/demo/fpn_flatten_pvt_t_80k_shapes.py \\
        work_dirs/demo/seg/iter_300.pth --palette ade20k

IMG is a picture, a folder of pictures (not recursive), or ``sample:NAME`` / ``sample:all`` for
the colour photos inside the scikit-image wheel (see ``mmeffvit.utils.SAMPLE_PHOTOS``). Drawn
pictures go to ``OUT_DIR/vis/``; raw predictions to ``OUT_DIR/preds/*.json`` (mmdet: boxes,
scores, labels, RLE masks) or ``OUT_DIR/pred/*.png`` (mmseg: label maps). Without a CHECKPOINT
the model keeps random weights: the tool says so and stamps it on every picture.
"""
import argparse
import os
import os.path as osp
import pickle
import sys
import warnings

# Make the checkout importable without installing it: the configs import mmeffvit through
# custom_imports, and it must win over an installed copy.
REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if sys.path[0] != REPO_ROOT:
    sys.path.insert(0, REPO_ROOT)

import mmcv  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402

import mmeffvit  # noqa: E402,F401  registers the models and mmeffvit's checkpoint loader
from mmeffvit.utils import SAMPLE_PHOTOS, sample_photo  # noqa: E402

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')
RANDOM_WEIGHTS = 'RANDOM WEIGHTS (no checkpoint): predictions are noise'
STAMP = 'RANDOM WEIGHTS - no checkpoint'


class ImageDemoError(ValueError):
    """Bad inputs, config, checkpoint or option: the message says which and why."""


def build_parser():
    parser = argparse.ArgumentParser(
        description='Draw the predictions of an mmdet/mmseg config (+ checkpoint) on pictures')
    parser.add_argument('img', metavar='IMG',
                        help='picture, folder of pictures, or sample:NAME / sample:all '
                        f'({", ".join(SAMPLE_PHOTOS)})')
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('checkpoint', nargs='?',
                        help='trained weights (without: random weights, for a dry run)')
    parser.add_argument('--out-dir', default='outputs', help='where vis/ and preds/ go')
    parser.add_argument('--device', default=None,
                        help='cpu, cuda or cuda:N (default: cuda:0 when available, else cpu)')
    parser.add_argument('--score-thr', type=float, default=None,
                        help='detection: draw only boxes/masks scoring at least this '
                        '(default 0.3)')
    parser.add_argument('--palette', default=None,
                        help="colours of the classes instead of the checkpoint's/config's: "
                        "'random', or a dataset's palette (mmdet: coco, voc, citys; mmseg: "
                        'ade20k, cityscapes, voc, ...)')
    parser.add_argument('--opacity', type=float, default=0.6,
                        help='segmentation: opacity of the drawn label map (0-1)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, key=value (as tools/train.py)')
    return parser


# ---- inputs ------------------------------------------------------------------------------------

def _readable(path):
    return osp.isfile(path) and mmcv.imread(path) is not None


def collect_images(spec):
    """The picture paths ``spec`` names; unreadable files in a folder are skipped with a note."""
    if spec.startswith('sample:'):
        name = spec[len('sample:'):]
        names = list(SAMPLE_PHOTOS) if name == 'all' else [name]
        try:
            return [sample_photo(n) for n in names]
        except (KeyError, OSError, ImportError) as err:
            raise ImageDemoError(err.args[0] if err.args else str(err)) from err
    if osp.isdir(spec):
        files = sorted(osp.join(spec, f) for f in os.listdir(spec)
                       if f.lower().endswith(IMAGE_SUFFIXES))
        good = [f for f in files if _readable(f)]
        for bad in sorted(set(files) - set(good)):
            print(f'image_demo: skipping {bad}: not a readable picture', file=sys.stderr)
        if not good:
            raise ImageDemoError(f'no readable picture ({"/".join(IMAGE_SUFFIXES)}) in {spec}')
        return good
    if not osp.isfile(spec):
        raise ImageDemoError(f'{spec} is neither a picture, a folder nor sample:NAME')
    if not _readable(spec):
        raise ImageDemoError(f'{spec} is not a readable picture (corrupt or not an image)')
    return [spec]


def resolve_device(device):
    if device is None:
        return 'cuda:0' if torch.cuda.is_available() else 'cpu'
    if device.startswith('cuda') and not torch.cuda.is_available():
        raise ImageDemoError(f'--device {device}, but torch sees no GPU (use --device cpu)')
    return device


# ---- the inferencers ---------------------------------------------------------------------------

def checkpoint_mismatch(model, checkpoint):
    """Why ``checkpoint`` cannot fill ``model`` (missing or misshapen weights), or None.

    mmengine loads inferencer weights with ``strict=False`` and only logs what is missing, so a
    checkpoint of another model (or a bare backbone) would give predictions of random heads.
    """
    state = checkpoint.get('state_dict', checkpoint)
    state = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in state.items()}
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    misshapen = [f'{k} {tuple(state[k].shape)} vs {tuple(v.shape)}' for k, v in own.items()
                 if k in state and hasattr(state[k], 'shape') and state[k].shape != v.shape]
    if not missing and not misshapen:
        return None
    lines = []
    if missing:
        lines.append(f'{len(missing)} of the model\'s {len(own)} weights are missing '
                     f'(first: {", ".join(missing[:5])})')
        if len(missing) == len(own) or all(not k.startswith('backbone.') for k in state):
            lines.append('it does not look like a checkpoint of this model (a backbone-only '
                         'file belongs in the backbone\'s init_cfg=dict(type="Pretrained"))')
    if misshapen:
        lines.append(f'{len(misshapen)} have another shape (first: {"; ".join(misshapen[:3])})')
    return '; '.join(lines)


def dataset_meta_from_config(cfg, scope):
    """classes/palette of the config's test dataset (built lazily: annotations are not read)."""
    if scope == 'mmdet':
        from mmdet.registry import DATASETS
    else:
        from mmseg.registry import DATASETS
    dataset_cfg = dict(cfg.test_dataloader.dataset, lazy_init=True)
    try:
        meta = DATASETS.build(dataset_cfg).metainfo
    except Exception as err:  # noqa: BLE001  a missing data root must not stop a demo
        print(f'image_demo: cannot read the class names of the config\'s test dataset ({err})',
              file=sys.stderr)
        return {}
    return {k: list(meta[k]) for k in ('classes', 'palette') if meta.get(k) is not None}


def seg_palette(name, num_classes):
    """An mmseg palette by dataset name, or a seeded random one, of ``num_classes`` colours."""
    if name == 'random':
        rng = np.random.default_rng(42)
        return [tuple(int(c) for c in rng.integers(0, 256, 3)) for _ in range(num_classes)]
    from mmseg.utils import get_palette
    try:
        palette = get_palette(name)
    except ValueError as err:
        raise ImageDemoError(f'--palette {name!r}: {err}') from err
    if len(palette) < num_classes:
        raise ImageDemoError(f'--palette {name!r} has {len(palette)} colours, the model '
                             f'{num_classes} classes')
    return [tuple(c) for c in palette[:num_classes]]


def _with_mmeffvit_checks(base, scope, palette_name):
    """A subclass of the toolbox inferencer ``base`` that refuses a checkpoint that does not fit
    the model and, when the checkpoint carries no class names, takes them from the config
    (instead of the toolbox's COCO / Cityscapes defaults)."""

    class Inferencer(base):

        def _load_weights_to_model(self, model, checkpoint, cfg):
            if checkpoint is not None:
                problem = checkpoint_mismatch(model, checkpoint)
                if problem:
                    raise ImageDemoError(f'the checkpoint does not fit the config\'s model: '
                                         f'{problem}')
            super()._load_weights_to_model(model, checkpoint, cfg)
            has_meta = checkpoint is not None and 'dataset_meta' in checkpoint.get('meta', {})
            if not has_meta:
                meta = dataset_meta_from_config(cfg, scope)
                if meta.get('classes'):
                    model.dataset_meta = dict(model.dataset_meta, **meta)
            if scope == 'mmseg':
                classes = model.dataset_meta['classes']
                if palette_name is not None:
                    model.dataset_meta['palette'] = seg_palette(palette_name, len(classes))
                elif len(model.dataset_meta.get('palette') or []) != len(classes):
                    model.dataset_meta['palette'] = seg_palette('random', len(classes))
            elif palette_name is not None:
                model.dataset_meta['palette'] = palette_name

    Inferencer.__name__ = f'MMEffViT{base.__name__}'
    return Inferencer


def build_inferencer(cfg, checkpoint, device, palette=None):
    """The toolbox inferencer of ``cfg``'s scope with mmeffvit's checkpoint and class checks."""
    scope = cfg.get('default_scope')
    if scope == 'mmdet':
        from mmdet.apis import DetInferencer
        if palette not in (None, 'random', 'coco', 'voc', 'citys'):
            raise ImageDemoError(f"--palette {palette!r}: mmdet knows 'random', 'coco', 'voc' "
                                 "and 'citys'")
        cls = _with_mmeffvit_checks(DetInferencer, scope, palette)
        return cls(model=cfg, weights=checkpoint, device=device, scope=scope, show_progress=False)
    if scope == 'mmseg':
        from mmseg.apis import MMSegInferencer
        cls = _with_mmeffvit_checks(MMSegInferencer, scope, palette)
        inferencer = cls(model=cfg, weights=checkpoint, device=device, scope=scope)
        inferencer.show_progress = False
        return inferencer
    raise ImageDemoError(f"default_scope {scope!r}: image_demo runs mmdet and mmseg configs "
                         "(default_scope='mmdet' or 'mmseg')")


# ---- outputs -----------------------------------------------------------------------------------

def stamp_random_weights(picture):
    """Write the random-weights warning across the top of a saved picture."""
    import cv2  # mmcv's dependency
    img = mmcv.imread(picture)
    height = max(16, img.shape[0] // 16)
    banner = np.zeros((height, img.shape[1], 3), np.uint8)
    banner[:] = (0, 0, 200)  # red, BGR
    font = cv2.FONT_HERSHEY_SIMPLEX
    (text_w, text_h), _ = cv2.getTextSize(STAMP, font, 1.0, 2)
    scale = min(0.6 * height / text_h, (img.shape[1] - 8) / text_w)
    cv2.putText(banner, STAMP, (4, int(height / 2 + scale * text_h / 2)), font, scale,
                (255, 255, 255), max(1, round(scale * 2)), cv2.LINE_AA)
    mmcv.imwrite(np.concatenate([banner, img], 0), picture)


def describe_detections(pred, classes, thr):
    kept = [(s, int(lab)) for s, lab in zip(pred['scores'], pred['labels']) if s >= thr]
    if not kept:
        return f'no object scores {thr} or more'
    shown = ', '.join(f'{classes[lab]} {s:.2f}' for s, lab in sorted(kept, reverse=True)[:5])
    return f'{len(kept)} object(s) scoring >= {thr}: {shown}' + (' ...' if len(kept) > 5 else '')


def describe_label_map(label_map, classes):
    ids, counts = np.unique(label_map, return_counts=True)
    order = np.argsort(-counts)[:5]
    return 'pixels: ' + ', '.join(
        f'{classes[ids[i]] if ids[i] < len(classes) else ids[i]} {counts[i] / label_map.size:.0%}'
        for i in order)


def run(args):
    """Predict and draw every picture of ``args``; returns the report lines."""
    images = collect_images(args.img)
    if not osp.isfile(args.config):
        raise ImageDemoError(f'config {args.config} not found')
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    scope = cfg.get('default_scope')
    if args.score_thr is not None and scope != 'mmdet':
        raise ImageDemoError('--score-thr applies to detection (mmdet) configs only')
    if args.checkpoint is not None and not osp.isfile(args.checkpoint):
        raise ImageDemoError(f'checkpoint {args.checkpoint} not found')
    if not 0 <= args.opacity <= 1:
        raise ImageDemoError(f'--opacity {args.opacity} is not in [0, 1]')
    device = resolve_device(args.device)
    random_weights = args.checkpoint is None
    if random_weights:
        print(f'\n{"!" * 80}\n!! {RANDOM_WEIGHTS}: pass a trained CHECKPOINT\n{"!" * 80}\n',
              file=sys.stderr, flush=True)
    with warnings.catch_warnings():
        # the toolboxes warn about defaults this tool replaces (class names, palette)
        warnings.filterwarnings('ignore', message='.*dataset_meta or class names are not saved')
        warnings.filterwarnings('ignore', message='.*weights is None, use')
        warnings.filterwarnings('ignore', message='.*palette does not exist')
        try:
            inferencer = build_inferencer(cfg, args.checkpoint, device, args.palette)
        except (RuntimeError, pickle.UnpicklingError) as err:
            # mmeffvit's loader names the file in what it refuses (corrupt, unsafe)
            if args.checkpoint and args.checkpoint in str(err):
                raise ImageDemoError(str(err)) from err
            raise
    classes = list(inferencer.model.dataset_meta['classes'])
    thr = 0.3 if args.score_thr is None else args.score_thr
    os.makedirs(args.out_dir, exist_ok=True)
    lines = []
    for path in images:
        if scope == 'mmdet':
            result = inferencer(path, out_dir=args.out_dir, pred_score_thr=thr,
                                no_save_pred=False)
            summary = describe_detections(result['predictions'][0], classes, thr)
        else:
            result = inferencer(path, out_dir=args.out_dir, opacity=args.opacity)
            summary = describe_label_map(result['predictions'], classes)
            # mmseg numbers its label maps; name them after the picture
            pred_dir = osp.join(args.out_dir, 'pred')
            numbered = osp.join(pred_dir, f'{inferencer.num_pred_imgs - 1:08d}_pred.png')
            if osp.isfile(numbered):
                stem = osp.splitext(osp.basename(path))[0]
                os.replace(numbered, osp.join(pred_dir, f'{stem}.png'))
        picture = osp.join(args.out_dir, 'vis', osp.basename(path))
        if not osp.isfile(picture):
            raise RuntimeError(f'the {scope} visualizer wrote no {picture}')
        if random_weights:
            stamp_random_weights(picture)
        lines.append(f'{osp.basename(path)}: {summary} -> {picture}')
    if random_weights:
        lines.append(f'!! {RANDOM_WEIGHTS}')
    return lines


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        lines = run(args)
    except ImageDemoError as err:
        parser.error(str(err))
    for line in lines:
        print(line)
    return 0


if __name__ == '__main__':
    sys.exit(main())
