"""The shapes data as an ImageNet-style classification set: one shape per image, class folders.

The layout is what mmpretrain's ``ImageNet`` dataset reads without annotation files (classes are
the sorted folder names, so :data:`SHAPES_CLS_CLASSES` is sorted too)::

    <root>/imagenet/train/<class>/<class>_00001.jpg ...
    <root>/imagenet/val/<class>/<class>_00001.jpg ...

Eight classes: the four shapes of the detection / segmentation data (circle, square, triangle,
star, drawn by the same code) and four more (cross, ellipse, hexagon, ring), so that a classifier
trained here has to tell apart round, polygonal and holed outlines. Every image holds exactly one
shape, rotated and placed at random, 35-80 % of the shorter side, in a colour far from its
background; backgrounds are a gradient, smooth colour blobs or stripes; the sides vary in
``[min_size, max_size]`` (64-96 px by default, CPU-sized). Every class gets the same number of
images. Generation is deterministic (one generator per image, seeded from the seed, split, class
and index, so the same arguments give byte-identical files, and more images leave the earlier ones
unchanged) and idempotent (an up-to-date copy is reused; different arguments regenerate it and
remove stale files, which a folder-scanning dataset would otherwise count).

Usage::

    python -m mmeffvit.datasets.shapes --out data/shapes --layouts imagenet
"""
import json
from pathlib import Path

import cv2
import numpy as np

from .shape_drawing import JPEG_QUALITY, draw_shape, pick_colour, random_background

# Bump whenever the generated content changes, so stale copies are regenerated.
CLS_GENERATOR_VERSION = 1
#: sorted, as mmpretrain's folder scan numbers the classes in sorted folder order
SHAPES_CLS_CLASSES = ('circle', 'cross', 'ellipse', 'hexagon', 'ring', 'square', 'star',
                      'triangle')
CLS_META_FILE = '.shapes_cls_meta.json'
CLS_SPLITS = ('train', 'val')
BACKGROUNDS = ('gradient', 'blobs', 'stripes')
# a constant in every image's seed: keeps these images' streams apart from the dense data's
_STREAM = 7


def _blobs(rng, base, h, w):
    """Smooth colour blobs: a 3x3 grid of colours near ``base``, bicubically enlarged."""
    grid = (base + rng.uniform(-50, 50, size=(3, 3, 3))).astype(np.float32)
    return cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)


def _stripes(rng, base, h, w):
    """Straight stripes at a random angle and period between ``base`` and a nearby colour."""
    other = base + rng.uniform(-50, 50, size=3)
    angle = rng.uniform(0, np.pi)
    period = rng.uniform(6, 16)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    phase = (xs * np.cos(angle) + ys * np.sin(angle)) * (2 * np.pi / period)
    weight = (0.5 + 0.5 * np.sin(phase))[..., None]
    return (base * (1 - weight) + other * weight).astype(np.float32)


def render_cls_image(rng, name, min_size, max_size):
    """Render one image holding one shape of class ``name``.

    Args:
        rng (np.random.Generator): Source of all randomness for this image.
        name (str): One of :data:`SHAPES_CLS_CLASSES`.
        min_size (int): Smallest image side.
        max_size (int): Largest image side.

    Returns:
        tuple[np.ndarray, np.ndarray]: The BGR uint8 image and the shape's bool mask.
    """
    h, w = (int(rng.integers(min_size, max_size + 1)) for _ in range(2))
    img, base = random_background(rng, h, w)
    kind = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    if kind == 'blobs':
        img = _blobs(rng, base, h, w)
    elif kind == 'stripes':
        img = _stripes(rng, base, h, w)
    size = rng.uniform(0.35, 0.8) * min(h, w)
    # at most a tenth of the extent may leave the frame on each side
    margin_x, margin_y = min(0.4 * size, w / 2), min(0.4 * size, h / 2)
    centre = (rng.uniform(margin_x, w - margin_x), rng.uniform(margin_y, h - margin_y))
    mask = draw_shape(name, (h, w), centre, size, rng.uniform(0, 2 * np.pi),
                      aspect=rng.uniform(0.4, 0.65)).astype(bool)
    img[mask] = pick_colour(rng, base, [])
    img += rng.normal(0, 3, size=img.shape).astype(np.float32)
    return np.clip(np.round(img), 0, 255).astype(np.uint8), mask


def _image_paths(root, split, counts):
    """``{class: [paths]}`` of one split as a generation with ``counts`` writes it."""
    return {name: [root / split / name / f'{name}_{i + 1:05d}.jpg' for i in range(counts[split])]
            for name in SHAPES_CLS_CLASSES}


def _remove_outputs(root):
    """Delete the images an earlier generation wrote (only files named like ours)."""
    for split in CLS_SPLITS:
        for name in SHAPES_CLS_CLASSES:
            for path in (root / split / name).glob(f'{name}_*.jpg'):
                path.unlink()


def generate_shapes_cls(root, num_train=160, num_val=40, seed=0, min_size=64, max_size=96,
                        overwrite=False):
    """Write the classification layout under ``<root>/imagenet`` unless it is up to date.

    Args:
        root (str | Path): The shapes data folder (the one holding ``coco/`` and ``ade/``).
        num_train (int): Training images per class.
        num_val (int): Validation images per class.
        seed (int): Non-negative seed.
        min_size (int): Smallest image side (at least 32).
        max_size (int): Largest image side.
        overwrite (bool): Regenerate even if an identical copy exists.

    Returns:
        dict: ``imagenet_root``, ``classes``, ``num_train`` and ``num_val`` (per class) and
        ``generated`` (False when an existing copy was reused).
    """
    if seed < 0 or num_train < 1 or num_val < 1 or not 32 <= min_size <= max_size:
        raise ValueError('need seed >= 0, num_train, num_val >= 1 (images per class) and '
                         f'32 <= min_size <= max_size; got seed={seed}, num_train={num_train}, '
                         f'num_val={num_val}, min_size={min_size}, max_size={max_size}')
    root = Path(root) / 'imagenet'
    args = dict(seed=int(seed), num_train=int(num_train), num_val=int(num_val),
                min_size=int(min_size), max_size=int(max_size),
                classes=list(SHAPES_CLS_CLASSES), generator_version=CLS_GENERATOR_VERSION)
    counts = {'train': args['num_train'], 'val': args['num_val']}
    result = dict(imagenet_root=str(root), classes=SHAPES_CLS_CLASSES,
                  num_train=counts['train'], num_val=counts['val'])
    meta_path = root / CLS_META_FILE
    if not overwrite and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError:  # a damaged marker: regenerate
            meta = {}
        if meta.get('args') == args and all(
                p.is_file() for split in CLS_SPLITS
                for paths in _image_paths(root, split, counts).values() for p in paths):
            return {**result, 'generated': False}

    # Remove the marker first so an interrupted run is never mistaken for a complete one.
    meta_path.unlink(missing_ok=True)
    _remove_outputs(root)
    for split_index, split in enumerate(CLS_SPLITS):
        for cls_index, (name, paths) in enumerate(_image_paths(root, split, counts).items()):
            paths[0].parent.mkdir(parents=True, exist_ok=True)
            for i, path in enumerate(paths):
                rng = np.random.default_rng([args['seed'], _STREAM, split_index, cls_index, i])
                image, _ = render_cls_image(rng, name, args['min_size'], args['max_size'])
                jpg = cv2.imencode('.jpg', image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])[1]
                path.write_bytes(jpg.tobytes())
    meta_path.parent.mkdir(parents=True, exist_ok=True)
    meta_path.write_text(json.dumps(dict(args=args), sort_keys=True, indent=2) + '\n')
    return {**result, 'generated': True}
