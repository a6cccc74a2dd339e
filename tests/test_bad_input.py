"""Bad input as a new user meets it: each case names the file or setting, or behaves correctly.

In-process checks of mmeffvit.engine.data_checks on the shapes data, then the command-line view
(one message, no traceback unless --debug) through tools/train.py.
"""
import json
import os
import os.path as osp
import shutil

import cv2
import numpy as np
import pytest
from mmengine.config import Config

from mmeffvit.datasets import generate_shapes
from mmeffvit.engine import data_checks
from mmeffvit.engine.errors import DataError

from cli_driver import run_jobs

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = 'configs/demo/fpn_flatten_pvt_t_80k_shapes.py'
PIPELINE = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True)]


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes')
    generate_shapes(str(root), num_train=6, num_val=2, min_size=64, max_size=96)
    data_checks.install_dataset_checks()
    return root


@pytest.fixture
def coco(shapes, tmp_path):
    """A private copy of the COCO-layout shapes data to break."""
    shutil.copytree(shapes / 'coco', tmp_path / 'coco')
    return tmp_path / 'coco'


def coco_dataset(root, **kwargs):
    from mmdet.datasets import CocoDataset
    return CocoDataset(data_root=str(root) + '/', ann_file='annotations/instances_train2017.json',
                       data_prefix=dict(img='train2017/'), pipeline=PIPELINE,
                       metainfo=dict(classes=('circle', 'square', 'triangle', 'star')),
                       filter_cfg=dict(filter_empty_gt=True, min_size=0), **kwargs)


def test_annotation_file_that_is_not_json(coco):
    ann = coco / 'annotations' / 'instances_train2017.json'
    ann.write_text('<html>not json</html>')
    with pytest.raises(DataError, match=f'annotation file .*{ann.name}.*JSONDecodeError'):
        coco_dataset(coco)


@pytest.mark.parametrize('content', [b'', b'\xff\xd8 not a jpeg'])
def test_empty_or_corrupt_image_is_named(coco, content):
    dataset = coco_dataset(coco)
    broken = dataset.get_data_info(0)['img_path']
    with open(broken, 'wb') as f:
        f.write(content)
    with pytest.raises(DataError, match=f'cannot load sample 0 .*{osp.basename(broken)}'):
        dataset[0]


def test_image_error_from_a_dataloader_worker_keeps_its_message(coco):
    from torch.utils.data import DataLoader

    from mmeffvit.engine.errors import user_error_message
    dataset = coco_dataset(coco)
    broken = dataset.get_data_info(0)['img_path']
    open(broken, 'wb').close()
    loader = DataLoader(dataset, batch_size=1, num_workers=1, collate_fn=lambda batch: batch)
    with pytest.raises(DataError) as err:
        next(iter(loader))
    message = user_error_message(err.value)
    assert message.startswith('DataError: CocoDataset') and broken in message
    assert 'Traceback' not in message and 'worker' not in message


def test_training_set_without_annotations(coco):
    ann = coco / 'annotations' / 'instances_train2017.json'
    data = json.loads(ann.read_text())
    data['annotations'] = []
    ann.write_text(json.dumps(data))
    with pytest.raises(DataError, match='removed all 6 images.*filter_empty_gt=False'):
        coco_dataset(coco)
    # the advice works: kept as background-only images
    from mmdet.datasets import CocoDataset
    kept = CocoDataset(data_root=str(coco) + '/', ann_file='annotations/instances_train2017.json',
                       data_prefix=dict(img='train2017/'), pipeline=PIPELINE,
                       metainfo=dict(classes=('circle', 'square', 'triangle', 'star')),
                       filter_cfg=dict(filter_empty_gt=False))
    assert len(kept) == 6


def test_dropped_empty_images_are_logged(coco, monkeypatch):
    ann = coco / 'annotations' / 'instances_train2017.json'
    data = json.loads(ann.read_text())
    first = data['images'][0]['id']
    data['annotations'] = [a for a in data['annotations'] if a['image_id'] != first]
    ann.write_text(json.dumps(data))
    logged = []
    monkeypatch.setattr(data_checks, 'print_log', lambda msg, **kw: logged.append(msg))
    dataset = coco_dataset(coco)
    without = {i['id'] for i in data['images']} - {a['image_id'] for a in data['annotations']}
    assert len(dataset) == 6 - len(without)
    assert len(logged) == 1 and f'dropped {len(without)} of 6 images' in logged[0]


def test_rgba_images_load_as_their_colour_channels(coco):
    dataset = coco_dataset(coco)
    info = dataset.get_data_info(0)
    bgr = cv2.imread(info['img_path'])
    alpha = np.full(bgr.shape[:2] + (1, ), 255, np.uint8)
    png = osp.splitext(info['img_path'])[0] + '.png'
    cv2.imwrite(png, np.concatenate([bgr, alpha], axis=2))
    assert cv2.imread(png, cv2.IMREAD_UNCHANGED).shape[2] == 4
    rgb_png = png.replace('.png', '_rgb.png')
    cv2.imwrite(rgb_png, bgr)
    from mmcv.transforms import LoadImageFromFile
    load = LoadImageFromFile()
    rgba = load(dict(img_path=png))['img']
    assert rgba.shape == bgr.shape  # alpha dropped, three colour channels in BGR order
    assert np.array_equal(rgba, load(dict(img_path=rgb_png))['img'])


def test_missing_data_root_names_the_setting(shapes, tmp_path):
    cfg = Config.fromfile(osp.join(ROOT, SEG_CFG))
    missing = str(tmp_path / 'nowhere')
    cfg.train_dataloader.dataset.data_root = missing
    with pytest.raises(DataError, match='train_dataloader.dataset.data_root: the folder .*nowhere'):
        data_checks.check_data_roots(cfg, ('train', 'val'))
    cfg.train_dataloader.dataset.data_root = str(shapes / 'ade' / 'ADEChallengeData2016')
    cfg.val_dataloader.dataset.data_root = str(shapes / 'ade' / 'ADEChallengeData2016')
    data_checks.check_data_roots(cfg, ('train', 'val'))


def test_folder_dataset_without_images(tmp_path):
    from mmseg.datasets import BaseSegDataset
    (tmp_path / 'img').mkdir()
    with pytest.raises(DataError, match='found no samples.*data_prefix'):
        BaseSegDataset(data_root=str(tmp_path), data_prefix=dict(img_path='img'),
                       metainfo=dict(classes=('a', 'b')))


# --- through tools/train.py --------------------------------------------------------------------

@pytest.fixture(scope='module')
def cli(shapes, tmp_path_factory):
    """The command-line cases below, run by ``tools/train.py`` one after another in one driver
    process (cli_driver.py; the imports paid once): ``{case: (returncode, output)}``."""
    tmp = tmp_path_factory.mktemp('cli')
    ade = shapes / 'ade' / 'ADEChallengeData2016'
    coco = tmp / 'coco'  # a private copy with a cut-short annotation file
    shutil.copytree(shapes / 'coco', coco)
    (coco / 'annotations' / 'instances_train2017.json').write_text('{"images": [')
    missing = ['--work-dir', str(tmp / 'missing'), '--cfg-options',
               f'train_dataloader.dataset.data_root={tmp}/missing']
    cases = {
        'missing_root': [SEG_CFG, *missing],
        'missing_root_debug': [SEG_CFG, *missing, '--debug'],
        'no_config': [str(tmp / 'no_such_config.py')],
        'unknown_type': [SEG_CFG, '--work-dir', str(tmp / 'type'), '--cfg-options',
                         f'train_dataloader.dataset.data_root={ade}',
                         f'val_dataloader.dataset.data_root={ade}',
                         'model.backbone.type=FLattenPVX'],
        'bad_annotation': ['configs/demo/mask_rcnn_flatten_pvt_t_1x_shapes.py', '--work-dir',
                           str(tmp / 'w'), '--cfg-options',
                           f'train_dataloader.dataset.data_root={coco}/',
                           f'val_dataloader.dataset.data_root={coco}/',
                           f'val_evaluator.ann_file={coco}/annotations/instances_val2017.json'],
        # a learning rate that overflows the weights
        'nan_loss': [SEG_CFG, '--work-dir', str(tmp / 'nan'), '--cfg-options',
                     f'train_dataloader.dataset.data_root={ade}',
                     f'val_dataloader.dataset.data_root={ade}', 'train_dataloader.batch_size=2',
                     'model.data_preprocessor.size=(64,64)',
                     'train_dataloader.dataset.pipeline.3.crop_size=(64,64)',
                     'optim_wrapper.optimizer.lr=1e30', 'param_scheduler=[]',
                     'train_cfg.max_iters=6', 'default_hooks.checkpoint.interval=1'],
    }
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
               OMP_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='')
    env.pop('MMEFFVIT_DEBUG', None)
    jobs = {name: dict(argv=['tools/train.py', *args]) for name, args in cases.items()}
    results = run_jobs(jobs, tmp, env)
    results['coco'] = coco
    results['nan_dir'] = tmp / 'nan'
    return results


def test_cli_missing_data_root_without_traceback(cli):
    rc, out = cli['missing_root']
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert 'error: DataError: train_dataloader.dataset.data_root: the folder' in out
    assert '--debug' in out
    rc, out = cli['missing_root_debug']
    assert rc == 1 and 'Traceback' in out and 'check_data_roots' in out


def test_cli_config_errors_without_traceback(cli):
    rc, out = cli['no_config']
    assert rc == 1 and 'Traceback' not in out and 'no_such_config.py' in out, out[-3000:]
    rc, out = cli['unknown_type']
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert 'FLattenPVX is not in the' in out and '\\n' not in out.split('FLattenPVX')[1]


@pytest.mark.e2e
def test_cli_bad_annotation_file_and_nan_loss(cli):
    rc, out = cli['bad_annotation']
    ann = cli['coco'] / 'annotations' / 'instances_train2017.json'
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert f'cannot read annotation file {ann}: JSONDecodeError' in out
    # stop at the first non-finite loss
    rc, out = cli['nan_loss']
    assert rc == 1 and 'Traceback' not in out, out[-3000:]
    assert 'error: NonFiniteLossError: non-finite loss at iteration' in out
    stopped = int(out.split('non-finite loss at iteration ')[1].split()[0])
    # no checkpoint of the non-finite step was written
    assert not osp.exists(cli['nan_dir'] / f'iter_{stopped}.pth')
