"""A procedurally generated "shapes" dataset in COCO-instance, ADE20K and ImageNet layouts.

Images hold 0-6 filled circles, squares, triangles and stars on a smooth background. The same
images are written once as a COCO instance-segmentation dataset and once as an ADE20K-style
semantic-segmentation dataset, so mmdet and mmseg configs can train and evaluate on a fresh
machine without downloading anything. Generation is deterministic: the same arguments give
byte-identical files. A classification set of one shape per image in ImageNet's class-folder
layout comes from :mod:`mmeffvit.datasets.shapes_cls` (``--layouts imagenet``; all three by
default).

Usage::

    python -m mmeffvit.datasets.shapes --out data/shapes
"""
import argparse
import json
from pathlib import Path

import cv2
import numpy as np

from .shape_drawing import JPEG_QUALITY, draw_shape, pick_colour, random_background
from .shapes_cls import generate_shapes_cls

# Bump whenever the generated content changes, so stale copies are regenerated.
GENERATOR_VERSION = 1

SHAPES_CLASSES = ('circle', 'square', 'triangle', 'star')
SHAPES_SEG_CLASSES = ('background', ) + SHAPES_CLASSES
SHAPES_DET_PALETTE = [(220, 20, 60), (0, 130, 230), (60, 180, 75), (250, 170, 30)]
SHAPES_SEG_PALETTE = [(120, 120, 120)] + SHAPES_DET_PALETTE

LAYOUTS = ('coco', 'ade')
MIN_VISIBLE_AREA = 64
EMPTY_IMAGE_FRACTION = 1 / 16
META_FILE = '.shapes_meta.json'
# (split name, COCO image folder, ADE folder)
_SPLITS = (('train', 'train2017', 'training'), ('val', 'val2017', 'validation'))
# Candidate draws per shape before giving up on it (a candidate is rejected when it would hide
# too much of an earlier shape or leave a hole that a COCO polygon cannot describe).
_MAX_TRIES = 10
_CROSS = cv2.getStructuringElement(cv2.MORPH_CROSS, (3, 3))


def _sample_side(rng, lo, hi):
    """Draw an image side in [lo, hi] that is not a multiple of 32 (to exercise padding)."""
    side = int(rng.integers(lo, hi + 1))
    if side % 32 == 0:
        step = int(rng.integers(1, 8))
        side = side + step if side + step <= hi else side - step
    return side


def _shape_mask(rng, cls_idx, h, w):
    """Rasterise one randomly placed shape of class ``cls_idx`` into a full uint8 mask."""
    size = rng.uniform(0.15, 0.45) * min(h, w)
    # Keep the centre far enough inside that at most about half the shape leaves the frame.
    cx = rng.uniform(0.25 * size, w - 0.25 * size)
    cy = rng.uniform(0.25 * size, h - 0.25 * size)
    theta = rng.uniform(0, 2 * np.pi)
    return draw_shape(SHAPES_CLASSES[cls_idx], (h, w), (cx, cy), size, theta)


def _visible_masks(masks):
    """Masks after occlusion: later shapes are painted over earlier ones."""
    if not masks:
        return []
    covered = np.zeros(masks[0].shape, bool)
    visible = []
    for mask in reversed(masks):
        visible.append(mask.astype(bool) & ~covered)
        covered |= mask.astype(bool)
    return visible[::-1]


def mask_to_polygons(mask):
    """Trace the outer outlines of a binary mask as COCO polygons.

    Contours are traced on a 2x nearest-upsampled copy, so the vertices lie a quarter pixel
    outside the centres of the boundary pixels. pycocotools then rasterises the polygons back to
    exactly the same pixels, whereas contours through the pixel centres would lose half a pixel
    all round (about 8% of a small shape).

    Args:
        mask (np.ndarray): (H, W) binary mask.

    Returns:
        tuple[list[list[float]], bool]: The polygons as flat ``[x0, y0, x1, y1, ...]`` lists,
        and whether filling them reproduces ``mask`` exactly (False when it has holes).
    """
    up = np.repeat(np.repeat(mask.astype(np.uint8), 2, axis=0), 2, axis=1)
    contours, _ = cv2.findContours(up, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    contours = [c for c in contours if len(c) >= 3]
    refilled = np.zeros_like(up)
    cv2.fillPoly(refilled, contours, 1)
    exact = bool(np.array_equal(refilled[::2, ::2], mask.astype(np.uint8)))
    polygons = [((c.reshape(-1, 2) + 0.5) / 2).ravel().tolist() for c in contours]
    return polygons, exact


def render_image(rng, min_size, max_size, empty=False):
    """Render one image and its instances.

    Args:
        rng (np.random.Generator): Source of all randomness for this image.
        min_size (int): Smallest image side.
        max_size (int): Largest image side.
        empty (bool): Draw no shapes at all.

    Returns:
        tuple[np.ndarray, list[tuple[int, np.ndarray]]]: The BGR uint8 image and
        ``(class index, visible bool mask)`` for every shape, in painting order.
    """
    h, w = _sample_side(rng, min_size, max_size), _sample_side(rng, min_size, max_size)
    img, base = random_background(rng, h, w)
    classes, masks, colours = [], [], []
    for _ in range(0 if empty else int(rng.integers(1, 7))):
        for _ in range(_MAX_TRIES):
            cls_idx = int(rng.integers(len(SHAPES_CLASSES)))
            mask = _shape_mask(rng, cls_idx, h, w)
            # Every painted shape must stay a valid annotation: large enough, and exactly
            # described by polygons (no holes).
            if all(vis.sum() >= MIN_VISIBLE_AREA and mask_to_polygons(vis)[1]
                   for vis in _visible_masks(masks + [mask])):
                classes.append(cls_idx)
                masks.append(mask)
                colours.append(pick_colour(rng, base, colours))
                break
    for mask, colour in zip(masks, colours):
        img[mask.astype(bool)] = colour
    img += rng.normal(0, 3, size=img.shape).astype(np.float32)
    image = np.clip(np.round(img), 0, 255).astype(np.uint8)
    return image, list(zip(classes, _visible_masks(masks)))


def semantic_label(shape, instances):
    """ADE20K-style label map: 0 unlabeled, 1 background, 2.. shape classes.

    The outline pixels of every shape are set to 0, like the unlabeled seams in ADE20K.

    Args:
        shape (tuple[int, int]): (H, W) of the image.
        instances (list[tuple[int, np.ndarray]]): ``(class index, visible mask)`` pairs.

    Returns:
        np.ndarray: (H, W) uint8 label map.
    """
    label = np.ones(shape, np.uint8)
    for cls_idx, vis in instances:
        label[vis] = cls_idx + 2
    # Erosion takes the neighbourhood minimum, so only the higher-valued side of each boundary,
    # i.e. the shape side, gets marked: a one pixel band on the shapes' outlines.
    label[cv2.erode(label, _CROSS) != label] = 0
    return label


def _coco_annotation(ann_id, image_id, cls_idx, vis):
    ys, xs = np.nonzero(vis)
    x0, y0 = int(xs.min()), int(ys.min())
    return {
        'id': ann_id,
        'image_id': image_id,
        'category_id': cls_idx + 1,
        'segmentation': mask_to_polygons(vis)[0],
        'bbox': [float(x0), float(y0), float(xs.max() - x0 + 1), float(ys.max() - y0 + 1)],
        'area': float(vis.sum()),
        'iscrowd': 0,
    }


def _paths(root):
    root = Path(root)
    return root / 'coco', root / 'ade' / 'ADEChallengeData2016'


def _expected_files(root, layouts, counts):
    """Every file a complete generation with these settings has written."""
    coco_root, ade_root = _paths(root)
    files = []
    for split, coco_dir, ade_dir in _SPLITS:
        stems = [f'shapes_{i + 1:06d}' for i in range(counts[split])]
        if 'coco' in layouts:
            files.append(coco_root / 'annotations' / f'instances_{coco_dir}.json')
            files += [coco_root / coco_dir / f'{s}.jpg' for s in stems]
        if 'ade' in layouts:
            files += [ade_root / 'images' / ade_dir / f'{s}.jpg' for s in stems]
            files += [ade_root / 'annotations' / ade_dir / f'{s}.png' for s in stems]
    return files


def _remove_outputs(root):
    """Delete what an earlier generation wrote; mmseg lists folders, so leftovers would count."""
    coco_root, ade_root = _paths(root)
    for _, coco_dir, ade_dir in _SPLITS:
        (coco_root / 'annotations' / f'instances_{coco_dir}.json').unlink(missing_ok=True)
        for folder in (coco_root / coco_dir, ade_root / 'images' / ade_dir,
                       ade_root / 'annotations' / ade_dir):
            for path in folder.glob('shapes_*'):
                path.unlink()


def _write_bytes(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _generate_split(root, layouts, split_index, num_images, seed, min_size, max_size):
    """Write one split in the requested layouts and return (num instances, num empty images)."""
    split, coco_dir, ade_dir = _SPLITS[split_index]
    coco_root, ade_root = _paths(root)
    num_empty = int(round(num_images * EMPTY_IMAGE_FRACTION))
    # mmdet's handling of images without annotations must always be exercised in training.
    if split == 'train' and num_images >= 8:
        num_empty = max(num_empty, 1)
    empty = np.zeros(num_images, bool)
    split_rng = np.random.default_rng([seed, split_index])
    empty[split_rng.choice(num_images, num_empty, replace=False)] = True

    images, annotations = [], []
    for i in range(num_images):
        # One generator per image, so adding images leaves the earlier ones unchanged.
        rng = np.random.default_rng([seed, split_index, i])
        image, instances = render_image(rng, min_size, max_size, empty=bool(empty[i]))
        stem = f'shapes_{i + 1:06d}'
        jpg = cv2.imencode('.jpg', image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])[1].tobytes()
        if 'coco' in layouts:
            _write_bytes(coco_root / coco_dir / f'{stem}.jpg', jpg)
        if 'ade' in layouts:
            png = cv2.imencode('.png', semantic_label(image.shape[:2], instances))[1].tobytes()
            _write_bytes(ade_root / 'images' / ade_dir / f'{stem}.jpg', jpg)
            _write_bytes(ade_root / 'annotations' / ade_dir / f'{stem}.png', png)
        images.append({'id': i + 1, 'file_name': f'{stem}.jpg',
                       'height': image.shape[0], 'width': image.shape[1]})
        for cls_idx, vis in instances:
            annotations.append(_coco_annotation(len(annotations) + 1, i + 1, cls_idx, vis))

    if 'coco' in layouts:
        coco = {
            'info': {'description': 'mmeffvit procedural shapes', 'version': GENERATOR_VERSION},
            'licenses': [],
            'categories': [{'id': i + 1, 'name': name, 'supercategory': 'shape'}
                           for i, name in enumerate(SHAPES_CLASSES)],
            'images': images,
            'annotations': annotations,
        }
        text = json.dumps(coco, sort_keys=True, separators=(',', ':')) + '\n'
        _write_bytes(coco_root / 'annotations' / f'instances_{coco_dir}.json', text.encode())
    return len(annotations), int(empty.sum())


def generate_shapes(root, num_train=64, num_val=16, seed=0, min_size=160, max_size=320,
                    layouts=('coco', 'ade'), overwrite=False):
    """Generate the shapes dataset under ``root`` unless an identical copy is already there.

    Args:
        root (str | Path): Output folder; gets ``coco/``, ``ade/ADEChallengeData2016/`` and a
            ``.shapes_meta.json`` marker recording the arguments.
        num_train (int): Number of training images.
        num_val (int): Number of validation images.
        seed (int): Non-negative seed; each split and image derives its own generator from it.
        min_size (int): Smallest image side (at least 32).
        max_size (int): Largest image side.
        layouts (Sequence[str]): Any of ``'coco'`` and ``'ade'``.
        overwrite (bool): Regenerate even if an identical copy exists.

    Returns:
        dict: ``root``, ``coco_root`` and ``ade_root`` (None for a layout not requested),
        ``num_train``, ``num_val``, ``num_instances`` and ``num_empty_images`` (per split), and
        ``generated`` (False when an existing copy was reused).
    """
    layouts = sorted(set([layouts] if isinstance(layouts, str) else layouts))
    if not layouts or set(layouts) - set(LAYOUTS):
        raise ValueError(f'layouts must be a non-empty subset of {LAYOUTS}, got {layouts}')
    if seed < 0 or num_train < 0 or num_val < 0 or not 32 <= min_size <= max_size:
        raise ValueError('need seed, num_train, num_val >= 0 and 32 <= min_size <= max_size')
    root = Path(root)
    args = dict(seed=int(seed), num_train=int(num_train), num_val=int(num_val),
                min_size=int(min_size), max_size=int(max_size), layouts=layouts,
                generator_version=GENERATOR_VERSION)
    counts = {'train': args['num_train'], 'val': args['num_val']}
    coco_root, ade_root = _paths(root)
    result = {'root': str(root),
              'coco_root': str(coco_root) if 'coco' in layouts else None,
              'ade_root': str(ade_root) if 'ade' in layouts else None,
              'num_train': counts['train'], 'num_val': counts['val']}

    meta_path = root / META_FILE
    if not overwrite and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get('args') == args and all(p.is_file()
                                            for p in _expected_files(root, layouts, counts)):
            return {**result, **meta['stats'], 'generated': False}

    # Remove the marker first so an interrupted run is never mistaken for a complete one.
    meta_path.unlink(missing_ok=True)
    _remove_outputs(root)
    stats = {'num_instances': {}, 'num_empty_images': {}}
    for split_index, (split, _, _) in enumerate(_SPLITS):
        n_inst, n_empty = _generate_split(root, layouts, split_index, counts[split], args['seed'],
                                          args['min_size'], args['max_size'])
        stats['num_instances'][split] = n_inst
        stats['num_empty_images'][split] = n_empty
    _write_bytes(meta_path, (json.dumps({'args': args, 'stats': stats}, sort_keys=True,
                                        indent=2) + '\n').encode())
    return {**result, **stats, 'generated': True}


def main(argv=None):
    """Command line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description='Generate the procedural shapes dataset.')
    parser.add_argument('--out', default='data/shapes', help='output folder')
    parser.add_argument('--num-train', type=int, default=64)
    parser.add_argument('--num-val', type=int, default=16)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--min-size', type=int, default=160)
    parser.add_argument('--max-size', type=int, default=320)
    parser.add_argument('--layouts', nargs='+', choices=LAYOUTS + ('imagenet', ),
                        default=list(LAYOUTS) + ['imagenet'],
                        help='coco / ade: the detection and segmentation images; imagenet: the '
                        'classification set (one shape per image, class folders)')
    parser.add_argument('--cls-num-train', type=int, default=160,
                        help='imagenet layout: training images per class')
    parser.add_argument('--cls-num-val', type=int, default=40,
                        help='imagenet layout: validation images per class')
    parser.add_argument('--cls-min-size', type=int, default=64,
                        help='imagenet layout: smallest image side')
    parser.add_argument('--cls-max-size', type=int, default=96,
                        help='imagenet layout: largest image side')
    parser.add_argument('--overwrite', action='store_true', help='regenerate even if up to date')
    opts = parser.parse_args(argv)
    dense = [layout for layout in opts.layouts if layout in LAYOUTS]
    res = {}
    if dense:
        res = generate_shapes(opts.out, opts.num_train, opts.num_val, opts.seed, opts.min_size,
                              opts.max_size, dense, opts.overwrite)
        print(('wrote' if res['generated'] else 'up to date:') +
              f" {res['num_train']} train / {res['num_val']} val images, "
              f"{res['num_instances']['train']} / {res['num_instances']['val']} instances, "
              f"{res['num_empty_images']['train']} / {res['num_empty_images']['val']} empty "
              'images')
        for key in ('coco_root', 'ade_root'):
            if res[key]:
                print(f'  {key}: {res[key]}')
    if 'imagenet' in opts.layouts:
        cls = generate_shapes_cls(opts.out, opts.cls_num_train, opts.cls_num_val, opts.seed,
                                  opts.cls_min_size, opts.cls_max_size, opts.overwrite)
        print(('wrote' if cls['generated'] else 'up to date:') +
              f" {cls['num_train']} train / {cls['num_val']} val images per class of "
              f"{len(cls['classes'])} classes ({', '.join(cls['classes'])})")
        print(f"  imagenet_root: {cls['imagenet_root']}")
        res['classification'] = cls
    return res


if __name__ == '__main__':
    main()
