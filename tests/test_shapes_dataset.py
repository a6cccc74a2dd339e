"""Tests for the procedural shapes dataset (mmeffvit.datasets.shapes)."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip('cv2')

from mmeffvit.datasets import (SHAPES_CLASSES, SHAPES_DET_PALETTE,  # noqa: E402
                               SHAPES_SEG_CLASSES, SHAPES_SEG_PALETTE, generate_shapes)
from mmeffvit.datasets.shapes import main  # noqa: E402

SPLITS = (('train2017', 'training'), ('val2017', 'validation'))
# pycocotools 2.0.x decode() trips a numpy 2 copy-keyword deprecation; not ours to fix.
pytestmark = pytest.mark.filterwarnings('ignore:__array__ implementation:DeprecationWarning')


def _all_files(root):
    return sorted(p for p in Path(root).rglob('*') if p.is_file())


def _read_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in _all_files(root)}


@pytest.fixture(scope='module')
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes')
    return generate_shapes(root, num_train=24, num_val=6, seed=1)


def _coco(dataset, coco_dir):
    mask_utils = pytest.importorskip('pycocotools.mask')
    from pycocotools.coco import COCO
    coco = COCO(os.path.join(dataset['coco_root'], 'annotations', f'instances_{coco_dir}.json'))
    return coco, mask_utils


def _decode(mask_utils, ann, h, w):
    return mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(ann['segmentation'], h, w)))


def test_constants():
    assert SHAPES_SEG_CLASSES == ('background', ) + SHAPES_CLASSES
    assert len(SHAPES_DET_PALETTE) == len(SHAPES_CLASSES)
    assert len(SHAPES_SEG_PALETTE) == len(SHAPES_SEG_CLASSES)
    for colour in SHAPES_DET_PALETTE + SHAPES_SEG_PALETTE:
        assert len(colour) == 3 and all(0 <= c <= 255 for c in colour)


def test_determinism(tmp_path):
    kwargs = dict(num_train=8, num_val=2, seed=3, min_size=96, max_size=160)
    generate_shapes(tmp_path / 'a', **kwargs)
    generate_shapes(tmp_path / 'b', **kwargs)
    files_a = _read_bytes(tmp_path / 'a')
    assert len(files_a) == 2 + 3 * 10 + 1  # 2 json, 10 x (2 jpg + 1 png), marker
    assert files_a == _read_bytes(tmp_path / 'b')

    # Another seed gives other annotations and other images.
    generate_shapes(tmp_path / 'c', **{**kwargs, 'seed': 4})
    files_c = _read_bytes(tmp_path / 'c')
    ann = 'coco/annotations/instances_train2017.json'
    img = 'coco/train2017/shapes_000001.jpg'
    assert files_c[ann] != files_a[ann]
    assert files_c[img] != files_a[img]

    # The number of validation images does not change the training split.
    generate_shapes(tmp_path / 'd', **{**kwargs, 'num_val': 3})
    files_d = _read_bytes(tmp_path / 'd')
    train = [k for k in files_a if 'train' in k]
    assert train and all(files_d[k] == files_a[k] for k in train)


def test_coco_layout(dataset):
    assert dataset['num_train'] == 24 and dataset['num_val'] == 6
    for coco_dir, _ in SPLITS:
        coco, mask_utils = _coco(dataset, coco_dir)
        cats = coco.loadCats(coco.getCatIds())
        assert [(c['id'], c['name'], c['supercategory']) for c in cats] == [
            (i + 1, name, 'shape') for i, name in enumerate(SHAPES_CLASSES)]
        assert 'info' in coco.dataset and coco.dataset['licenses'] == []
        ann_ids = [a['id'] for a in coco.dataset['annotations']]
        assert sorted(ann_ids) == list(range(1, len(ann_ids) + 1))

        num_empty = 0
        for img_id in coco.getImgIds():
            info = coco.loadImgs(img_id)[0]
            h, w = info['height'], info['width']
            assert h % 32 and w % 32
            image = cv2.imread(os.path.join(dataset['coco_root'], coco_dir, info['file_name']))
            assert image.shape[:2] == (h, w)
            anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
            num_empty += not anns
            for ann in anns:
                assert ann['category_id'] in (1, 2, 3, 4) and ann['iscrowd'] == 0
                assert ann['area'] >= 64
                assert all(len(poly) >= 6 and len(poly) % 2 == 0 for poly in ann['segmentation'])
                mask = _decode(mask_utils, ann, h, w)
                assert abs(int(mask.sum()) - ann['area']) <= 0.03 * ann['area']
                x, y, bw, bh = ann['bbox']
                assert x >= 0 and y >= 0 and bw > 0 and bh > 0 and x + bw <= w and y + bh <= h
                ys, xs = np.nonzero(mask)
                assert [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] == pytest.approx(
                    [x, y, x + bw, y + bh], abs=1)
        if coco_dir == 'train2017':
            assert num_empty >= 1
            assert dataset['num_empty_images']['train'] == num_empty
        assert dataset['num_instances'][coco_dir[:-4]] == len(ann_ids)


def test_ade_layout_matches_coco(dataset):
    ade_root = Path(dataset['ade_root'])
    for coco_dir, ade_dir in SPLITS:
        coco, mask_utils = _coco(dataset, coco_dir)
        images = sorted((ade_root / 'images' / ade_dir).glob('*.jpg'))
        labels = sorted((ade_root / 'annotations' / ade_dir).glob('*.png'))
        assert [p.stem for p in images] == [p.stem for p in labels]
        assert len(images) == len(coco.getImgIds())
        by_name = {img['file_name']: img for img in coco.dataset['images']}
        for img_path, label_path in zip(images, labels):
            info = by_name[img_path.name]
            # The ADE copy of an image is the very same file as the COCO one.
            coco_img = Path(dataset['coco_root'], coco_dir, img_path.name)
            assert img_path.read_bytes() == coco_img.read_bytes()
            label = cv2.imread(str(label_path), cv2.IMREAD_UNCHANGED)
            assert label.ndim == 2 and label.dtype == np.uint8
            assert label.shape == (info['height'], info['width'])
            assert set(np.unique(label).tolist()) <= {0, 1, 2, 3, 4, 5}
            anns = coco.loadAnns(coco.getAnnIds(imgIds=info['id']))
            if not anns:
                assert (label == 1).all()
                continue
            assert 0 < (label == 0).mean() < 0.15
            for ann in anns:
                mask = _decode(mask_utils, ann, info['height'], info['width'])
                interior = cv2.erode(mask, np.ones((3, 3), np.uint8)).astype(bool)
                if interior.any():
                    assert (label[interior] == ann['category_id'] + 1).mean() > 0.95


def test_idempotent_and_overwrite(tmp_path):
    kwargs = dict(num_train=3, num_val=2, seed=5, min_size=64, max_size=96)
    first = generate_shapes(tmp_path, **kwargs)
    assert first['generated']
    files = _all_files(tmp_path)
    old = 1_000_000_000  # mark every file as written long ago
    for p in files:
        os.utime(p, (old, old))

    second = generate_shapes(tmp_path, **kwargs)
    assert not second['generated']
    assert {k: v for k, v in second.items() if k != 'generated'} == {
        k: v for k, v in first.items() if k != 'generated'}
    assert all(p.stat().st_mtime == old for p in files)

    generate_shapes(tmp_path, overwrite=True, **kwargs)
    assert all(p.stat().st_mtime != old for p in files)

    # Different arguments regenerate, and files of the larger earlier run are removed.
    generate_shapes(tmp_path, **{**kwargs, 'num_val': 1})
    ade_val = tmp_path / 'ade' / 'ADEChallengeData2016' / 'images' / 'validation'
    assert [p.name for p in ade_val.iterdir()] == ['shapes_000001.jpg']
    meta = json.loads((tmp_path / '.shapes_meta.json').read_text())
    assert meta['args']['num_val'] == 1

    # A missing file triggers regeneration as well.
    missing = tmp_path / 'coco' / 'train2017' / 'shapes_000002.jpg'
    missing.unlink()
    assert generate_shapes(tmp_path, **{**kwargs, 'num_val': 1})['generated']
    assert missing.is_file()

    # Dropping a layout removes its stale files.
    generate_shapes(tmp_path, layouts=('ade', ), **{**kwargs, 'num_val': 1})
    assert not list((tmp_path / 'coco').rglob('*.*'))


def test_single_layout_and_cli(tmp_path, capsys):
    res = generate_shapes(tmp_path / 'ade_only', num_train=2, num_val=1, layouts=('ade', ))
    assert res['coco_root'] is None and not (tmp_path / 'ade_only' / 'coco').exists()
    with pytest.raises(ValueError):
        generate_shapes(tmp_path / 'bad', layouts=('voc', ))

    out = tmp_path / 'cli'
    argv = ['--out', str(out), '--num-train', '2', '--num-val', '1', '--seed', '7',
            '--cls-num-train', '1', '--cls-num-val', '1']  # all three layouts, small
    main(argv)
    assert 'wrote 2 train / 1 val images' in capsys.readouterr().out
    main(argv)
    assert 'up to date' in capsys.readouterr().out
    assert (out / 'coco' / 'annotations' / 'instances_val2017.json').is_file()
    assert (out / 'imagenet' / 'val' / 'star' / 'star_00001.jpg').is_file()
