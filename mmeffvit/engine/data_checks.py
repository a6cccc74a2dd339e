"""Data set errors that name the file, and the setting to change.

OpenMMLab datasets fail on bad input with messages that omit where it came from: a non-JSON
annotation file raises ``JSONDecodeError: ... line 1 column 1``, a 0-byte image an OpenCV
assertion, and a training set whose images all lack annotations ``need at least one array to
concatenate`` (mmdet's ``filter_empty_gt`` drops them silently, then mmengine serializes an empty
list). mmengine has no extension point between a dataset and these steps, so
:func:`install_dataset_checks` wraps, once, the three methods every mmengine dataset goes through:
``full_init`` (mmengine's and mmdet's), around ``load_data_list`` and ``filter_data``, and
``prepare_data``. The wrappers add context and checks; results are unchanged.

:func:`check_data_roots` runs before the runner is built and names the config key of a missing
data root.
"""
import functools
import os.path as osp
from typing import List

from mmengine.logging import print_log

from .errors import DataError

_INSTALLED = []


def _describe(dataset) -> str:
    parts = [type(dataset).__name__]
    ann_file = getattr(dataset, 'ann_file', '')
    if ann_file:
        parts.append(f'ann_file={ann_file!r}')
    elif getattr(dataset, 'data_root', ''):
        parts.append(f'data_root={dataset.data_root!r}')
    return ' '.join(parts)


def _files_of(data_info) -> str:
    if not isinstance(data_info, dict):
        return ''
    files = [str(v) for k, v in data_info.items() if k.endswith('_path') and isinstance(v, str)]
    return ', '.join(files)


def _load_data_list(dataset, load):
    try:
        data_list = load()
    except DataError:
        raise
    except Exception as err:
        ann_file = getattr(dataset, 'ann_file', '')
        what = f'annotation file {ann_file}' if ann_file else f'the data of {_describe(dataset)}'
        raise DataError(f'cannot read {what}: {type(err).__name__}: {err}') from err
    if not data_list:
        raise DataError(
            f'{_describe(dataset)} found no samples: check the annotation file, data_root and '
            f"data_prefix ({getattr(dataset, 'data_prefix', {})}) and the file suffixes")
    return data_list


def _filter_data(dataset, filter_data):
    before = len(dataset.data_list)
    kept = filter_data()
    dropped = before - len(kept)
    filter_cfg = getattr(dataset, 'filter_cfg', None)
    if dropped and not kept:
        raise DataError(
            f'{_describe(dataset)}: filter_cfg={filter_cfg} removed all {before} images (mmdet '
            'drops images without annotations when filter_empty_gt=True). Add annotations, or '
            'keep such images with --cfg-options '
            'train_dataloader.dataset.filter_cfg.filter_empty_gt=False (they then train as '
            'background only)')
    if dropped:
        print_log(f'{_describe(dataset)}: filter_cfg={filter_cfg} dropped {dropped} of {before} '
                  'images (images without annotations, or smaller than min_size); '
                  'filter_cfg.filter_empty_gt=False keeps the images without annotations',
                  logger='current')
    return kept


def _wrap_full_init(full_init):

    @functools.wraps(full_init)
    def checked_full_init(self):
        if getattr(self, '_fully_initialized', False) or 'filter_data' in self.__dict__:
            return full_init(self)  # done, or inside another checked full_init (super call)
        # instance attributes shadow the class's methods for the call of full_init only
        load, filt = self.load_data_list, self.filter_data
        self.load_data_list = lambda: _load_data_list(self, load)
        self.filter_data = lambda: _filter_data(self, filt)
        try:
            return full_init(self)
        finally:
            self.__dict__.pop('load_data_list', None)
            self.__dict__.pop('filter_data', None)

    checked_full_init._mmeffvit_checked = True
    return checked_full_init


def _wrap_prepare_data(prepare_data):

    @functools.wraps(prepare_data)
    def checked_prepare_data(self, idx):
        try:
            return prepare_data(self, idx)
        except DataError:
            raise
        except Exception as err:
            try:
                files = _files_of(self.get_data_info(idx))
            except Exception:  # noqa: B902 - the original error matters, not this one
                files = ''
            where = f' ({files})' if files else ''
            raise DataError(f'{_describe(self)}: cannot load sample {idx}{where}: '
                            f'{type(err).__name__}: {err}') from err

    checked_prepare_data._mmeffvit_checked = True
    return checked_prepare_data


def _dataset_classes() -> List[type]:
    from mmengine.dataset import BaseDataset
    classes = [BaseDataset]
    try:
        from mmdet.datasets import BaseDetDataset
        classes.append(BaseDetDataset)
    except ImportError:
        pass
    return classes


def install_dataset_checks() -> None:
    """Wrap ``full_init`` and ``prepare_data`` of mmengine's (and mmdet's) base datasets, once."""
    if _INSTALLED:
        return
    for cls in _dataset_classes():
        for name, wrap in (('full_init', _wrap_full_init), ('prepare_data', _wrap_prepare_data)):
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, '_mmeffvit_checked', False):
                setattr(cls, name, wrap(method))
    _INSTALLED.append(True)


def _dataset_cfgs(cfg, splits):
    for split in splits:
        loader = cfg.get(f'{split}_dataloader', None)
        if not loader or 'dataset' not in loader:
            continue
        dataset, key = loader['dataset'], f'{split}_dataloader.dataset'
        while isinstance(dataset, dict) and 'dataset' in dataset:  # RepeatDataset & co
            dataset, key = dataset['dataset'], key + '.dataset'
        if isinstance(dataset, dict):
            yield key, dataset


def check_data_roots(cfg, splits) -> None:
    """Raise :class:`DataError` naming the config key when a dataset's data_root is missing."""
    for key, dataset in _dataset_cfgs(cfg, splits):
        root = dataset.get('data_root', None)
        if isinstance(root, str) and root and '://' not in root and not osp.isdir(root):
            hint = ''
            if 'shapes' in root:
                hint = (' The demo data is made with: python -m mmeffvit.datasets.shapes '
                        '--out data/shapes (tools/demo.py does it).')
            raise DataError(
                f'{key}.data_root: the folder {root!r} does not exist (relative to '
                f'{osp.abspath(".")}).{hint} Point the config at the data with --cfg-options '
                f'{key}.data_root=PATH')
