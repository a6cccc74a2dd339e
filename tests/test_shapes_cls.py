"""The shapes classification set (mmeffvit.datasets.shapes_cls): layout read by mmpretrain's
ImageNet dataset, class balance, one shape per image, determinism and idempotence."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip('cv2')

from mmeffvit.datasets import SHAPES_CLS_CLASSES, generate_shapes_cls  # noqa: E402
from mmeffvit.datasets.shapes import main  # noqa: E402
from mmeffvit.datasets.shapes_cls import CLS_META_FILE, render_cls_image  # noqa: E402


def _read_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(Path(root).rglob('*')) if p.is_file()}


@pytest.fixture(scope='module')
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes_cls')
    return generate_shapes_cls(root, num_train=6, num_val=3, seed=1, min_size=48, max_size=72)


def test_classes_are_sorted_like_mmpretrains_folder_scan():
    assert list(SHAPES_CLS_CLASSES) == sorted(SHAPES_CLS_CLASSES)
    assert len(set(SHAPES_CLS_CLASSES)) == 8
    assert {'circle', 'square', 'triangle', 'star'} <= set(SHAPES_CLS_CLASSES)


def test_layout_is_balanced_and_read_by_mmpretrain_imagenet(dataset):
    from mmpretrain.datasets import ImageNet
    root = Path(dataset['imagenet_root'])
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ['train', 'val']
    for split, per_class in (('train', 6), ('val', 3)):
        folders = sorted(p.name for p in (root / split).iterdir())
        assert folders == list(SHAPES_CLS_CLASSES)
        for name in folders:
            files = sorted((root / split / name).iterdir())
            assert [p.name for p in files] == [f'{name}_{i:05d}.jpg'
                                               for i in range(1, per_class + 1)]
            for path in files:
                h, w = cv2.imread(str(path)).shape[:2]
                assert 48 <= h <= 72 and 48 <= w <= 72
        ds = ImageNet(data_root=str(root), split=split,
                      metainfo=dict(classes=SHAPES_CLS_CLASSES), pipeline=[])
        assert len(ds) == per_class * len(SHAPES_CLS_CLASSES)
        assert ds.CLASSES == SHAPES_CLS_CLASSES
        for i in range(len(ds)):  # the label of every sample is its folder's class
            info = ds.get_data_info(i)
            assert SHAPES_CLS_CLASSES[info['gt_label']] == Path(info['img_path']).parent.name
        counts = np.bincount([ds.get_data_info(i)['gt_label'] for i in range(len(ds))])
        assert counts.tolist() == [per_class] * len(SHAPES_CLS_CLASSES)


@pytest.mark.parametrize('name', SHAPES_CLS_CLASSES)
def test_one_visible_shape_per_image(name):
    for i in range(20):
        rng = np.random.default_rng([11, i])
        image, mask = render_cls_image(rng, name, 64, 96)
        h, w = image.shape[:2]
        assert mask.shape == (h, w) and 64 <= h <= 96 and 64 <= w <= 96
        # one connected object, 35-80 % of the shorter side, at most slightly cut by the frame
        num, _ = cv2.connectedComponents(mask.astype(np.uint8))
        assert num == 2, (name, i)
        ys, xs = np.nonzero(mask)
        extent = max(ys.max() - ys.min(), xs.max() - xs.min()) + 1
        assert 0.25 * min(h, w) <= extent <= max(h, w)
        # the shape stands out: its colour is far from the background's mean colour
        inside = image[mask].astype(float).mean(0)
        outside = image[~mask].astype(float).mean(0)
        assert np.linalg.norm(inside - outside) > 40, (name, i)
        if name == 'ring':  # exactly one background region away from the frame: the hole
            num, labels = cv2.connectedComponents((~mask).astype(np.uint8))
            border = set(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))
            assert len(set(range(1, num)) - border) == 1, i


def test_classes_differ_in_shape_not_just_in_noise():
    """The same generator state drawn as two classes gives different masks."""
    masks = {name: render_cls_image(np.random.default_rng(5), name, 80, 80)[1]
             for name in SHAPES_CLS_CLASSES}
    names = list(masks)
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            assert (masks[names[a]] != masks[names[b]]).mean() > 0.005, (names[a], names[b])


def test_deterministic(tmp_path):
    kwargs = dict(num_train=3, num_val=2, seed=4, min_size=40, max_size=56)
    generate_shapes_cls(tmp_path / 'a', **kwargs)
    generate_shapes_cls(tmp_path / 'b', **kwargs)
    files_a = _read_bytes(tmp_path / 'a')
    assert len(files_a) == 8 * (3 + 2) + 1  # images + marker
    assert files_a == _read_bytes(tmp_path / 'b')
    generate_shapes_cls(tmp_path / 'c', **{**kwargs, 'seed': 5})
    files_c = _read_bytes(tmp_path / 'c')
    images = [k for k in files_a if k.endswith('.jpg')]
    assert all(files_c[k] != files_a[k] for k in images)
    # more images per class leave the earlier ones unchanged
    generate_shapes_cls(tmp_path / 'd', **{**kwargs, 'num_train': 4})
    files_d = _read_bytes(tmp_path / 'd')
    assert all(files_d[k] == files_a[k] for k in images)


def test_idempotent_and_removes_stale_files(tmp_path):
    kwargs = dict(num_train=3, num_val=1, seed=0, min_size=40, max_size=48)
    assert generate_shapes_cls(tmp_path, **kwargs)['generated']
    images = sorted((tmp_path / 'imagenet').rglob('*.jpg'))
    old = 1_000_000_000
    for p in images:
        os.utime(p, (old, old))
    assert not generate_shapes_cls(tmp_path, **kwargs)['generated']
    assert all(p.stat().st_mtime == old for p in images)

    # fewer images: the surplus of the earlier run is gone (a folder scan would count it)
    generate_shapes_cls(tmp_path, **{**kwargs, 'num_train': 2})
    assert sorted(p.name for p in (tmp_path / 'imagenet' / 'train' / 'star').iterdir()) == [
        'star_00001.jpg', 'star_00002.jpg']
    meta = json.loads((tmp_path / 'imagenet' / CLS_META_FILE).read_text())
    assert meta['args']['num_train'] == 2

    # a missing image or a damaged marker regenerates
    missing = tmp_path / 'imagenet' / 'val' / 'ring' / 'ring_00001.jpg'
    missing.unlink()
    assert generate_shapes_cls(tmp_path, **{**kwargs, 'num_train': 2})['generated']
    assert missing.is_file()
    (tmp_path / 'imagenet' / CLS_META_FILE).write_text('{not json')
    assert generate_shapes_cls(tmp_path, **{**kwargs, 'num_train': 2})['generated']
    # the dense layouts' files are not touched
    assert not (tmp_path / 'coco').exists() and not (tmp_path / 'ade').exists()


@pytest.mark.parametrize('bad', [dict(num_train=0), dict(num_val=0), dict(seed=-1),
                                 dict(min_size=16), dict(min_size=80, max_size=64)])
def test_bad_arguments(tmp_path, bad):
    with pytest.raises(ValueError, match='per class|min_size'):
        generate_shapes_cls(tmp_path, **bad)


def test_cli_writes_the_imagenet_layout(tmp_path, capsys):
    argv = ['--out', str(tmp_path), '--layouts', 'imagenet', '--cls-num-train', '2',
            '--cls-num-val', '1', '--cls-min-size', '40', '--cls-max-size', '48']
    res = main(argv)
    out = capsys.readouterr().out
    assert 'wrote 2 train / 1 val images per class of 8 classes' in out
    assert res['classification']['generated'] and not (tmp_path / 'coco').exists()
    main(argv)
    assert 'up to date' in capsys.readouterr().out
