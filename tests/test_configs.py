"""Every config builds in its toolbox, runs a forward pass and computes its losses; the layout of
``configs/`` (names, inheritance, entry points, the demo overrides) holds."""
import ast
import glob
import json
import os
import os.path as osp
import re

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

import mmeffvit  # noqa: F401

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True))
CONFIGS = [c for c in CONFIGS if '/_base_/' not in c]

# sizes of the variants: the default run checks the smallest (same code, fewer and narrower
# layers than the larger ones)
_SIZE_RANK = {'t': 0, 'b0': 0, 's0': 0, 's': 1, 'b1': 1, 's1': 1, 'm': 2, 'b2': 2, 's2': 2,
              'b': 3, 'l': 3}


def _group_and_rank(path):
    stem = osp.splitext(osp.basename(path))[0]
    match = re.match(r'(.+?)_(t|s|m|b|l|b\d|s\d)_(.+)$', stem)
    if match is None:
        return stem, 0
    return f'{match.group(1)}_{match.group(3)}', _SIZE_RANK[match.group(2)]


def _model_family_backbone(path):
    """(detector/segmentor, family, backbone type) of a config; the demo folder and the top-level
    entry points are families of their own (other data and classes; always checked)."""
    stem = osp.splitext(osp.basename(path))[0]
    match = re.match(r'(cascade_mask_rcnn|mask_rcnn|retinanet|fpn|upernet)_'
                     r'(flatten_[a-z0-9]+|[a-z0-9]+)_(t|s|m|b|l|b\d|s\d)_', stem)
    folder = osp.relpath(osp.dirname(path), osp.join(ROOT, 'configs'))
    if match is None:  # a kind of config this grouping does not know: a group of its own
        return stem, folder, stem
    return match.group(1), folder, match.group(2)


def _default_run_configs():
    """One representative per (detector/segmentor x family) runs by default: the smallest
    variant and, among the smallest, the backbone type checked least so far, so that every
    backbone type meets a neck at least once; the entry points always. The rest: -m slow."""
    groups = {}
    for path in CONFIGS:
        model, family, backbone = _model_family_backbone(path)
        groups.setdefault((model, family), []).append((_group_and_rank(path)[1], backbone, path))
    chosen, covered = set(), {}
    for key in sorted(groups, key=lambda k: (k[1] != '.', k)):  # entry points first
        members = groups[key]
        if key[1] != '.':
            smallest = min(rank for rank, _, _ in members)
            backbone = min((covered.get(b, 0), b) for rank, b, _ in members if rank == smallest)[1]
            members = [m for m in members if m[0] == smallest and m[1] == backbone]
        for _, backbone, path in members:
            chosen.add(path)
            covered[backbone] = covered.get(backbone, 0) + 1
    return chosen


def _params():
    default = _default_run_configs()
    return [pytest.param(path, marks=() if path in default else (pytest.mark.slow, ),
                         id=osp.relpath(path, ROOT)) for path in CONFIGS]


# configs that differ only in schedule or data (1x / 3x) share a model: check each model once
_CHECKED_MODELS = {}


def load(path):
    cfg = Config.fromfile(path)
    # no ImageNet weights in tests; the Pretrained path is covered by the backbone tests
    if cfg.default_scope != 'mmpretrain':  # classifiers train their backbone from scratch
        cfg.model.backbone.init_cfg = None
    if cfg.default_scope == 'mmseg':
        # the 512x512 crop only costs time here; the heads run at any size divisible by 32
        cfg.model.data_preprocessor.size = (128, 128)
    return cfg


def det_losses(cfg):
    from mmdet.registry import MODELS
    from mmdet.testing import demo_mm_inputs
    model = MODELS.build(cfg.model)
    model.init_weights()
    head = cfg.model.roi_head.bbox_head if 'roi_head' in cfg.model else cfg.model.bbox_head
    num_classes = (head[0] if isinstance(head, list) else head).num_classes  # cascade: 3 heads
    packed = demo_mm_inputs(2, [[3, 133, 181], [3, 160, 121]], num_items=[3, 0],
                            num_classes=num_classes, with_mask=True)
    data = model.data_preprocessor(packed, training=True)
    return model, model(**data, mode='loss')


def seg_losses(cfg):
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample
    from mmengine.structures import PixelData
    model = MODELS.build(cfg.model)
    model.init_weights()
    size = cfg.model.data_preprocessor.size
    samples = []
    for h, w in [(size[0], size[1]), (size[0] - 13, size[1] - 7)]:
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w)))
        label = torch.randint(0, cfg.model.decode_head.num_classes, (1, h, w))
        label[:, :5] = 255  # some ignored pixels
        sample.gt_sem_seg = PixelData(data=label)
        samples.append(sample)
    packed = dict(inputs=[torch.randint(0, 255, (3, s.img_shape[0], s.img_shape[1]),
                                        dtype=torch.uint8) for s in samples],
                  data_samples=samples)
    data = model.data_preprocessor(packed, training=True)
    return model, model(**data, mode='loss')


def cls_losses(cfg):
    from mmpretrain.registry import MODELS
    from mmpretrain.structures import DataSample
    model = MODELS.build(cfg.model)
    model.init_weights()
    num_classes = cfg.model.head.num_classes
    # 2 images: Mixup / CutMix of the recipe's data preprocessor mix them
    samples = [DataSample().set_gt_label(label) for label in (0, num_classes - 1)]
    packed = dict(inputs=[torch.randint(0, 255, (3, 64, 64), dtype=torch.uint8)
                          for _ in samples], data_samples=samples)
    data = model.data_preprocessor(packed, training=True)
    return model, model(**data, mode='loss')


@pytest.mark.parametrize('path', _params())
def test_config_builds_and_computes_losses(path):
    cfg = load(path)
    assert 'backbone' not in cfg, 'a backbone base taken without _base_.pop'
    scope = cfg.default_scope
    model_cfg = cfg.model.to_dict()
    if scope == 'mmpretrain':  # a demo classifier is its ImageNet model with 8 classes
        model_cfg['head'].pop('num_classes')
    key = scope + json.dumps(model_cfg, sort_keys=True, default=str)
    if key in _CHECKED_MODELS:
        return  # the config loads, and its model is identical to one already checked
    _CHECKED_MODELS[key] = osp.relpath(path, ROOT)
    init_default_scope(scope)
    if scope == 'mmdet':
        model, losses = det_losses(cfg)
        assert any(k.endswith('loss_cls') for k in losses), sorted(losses)  # cascade: s0.loss_cls
    elif scope == 'mmseg':
        model, losses = seg_losses(cfg)
        assert 'decode.loss_ce' in losses
    elif scope == 'mmpretrain':
        model, losses = cls_losses(cfg)
        assert any(k.startswith('loss') for k in losses), sorted(losses)  # CARE: two heads
    else:
        pytest.fail(f'unexpected default_scope {scope}')
    total, log_vars = model.parse_losses(losses)
    assert torch.isfinite(total)
    total.backward()
    backbone_grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert all(g is not None for g in backbone_grads), 'a backbone parameter got no gradient'


# --- layout ------------------------------------------------------------------------------------

CONFIG_DIR = osp.join(ROOT, 'configs')
FAMILIES = ('flatten', 'lavit', 'care', 'l2vit', 'focal')
#: the README's commands name these: thin files at the top of configs/ over their family config
ENTRY_POINTS = {'mask_rcnn_flatten_pvt_t_1x.py': 'flatten/mask_rcnn_flatten_pvt_t_1x_coco.py',
                'fpn_flatten_pvt_t_80k_ade20k.py': 'flatten/fpn_flatten_pvt_t_80k_ade20k.py'}
_BACKBONE = r'(flatten_(pvt|pvtv2|swin|cswin)|lavit|care|l2vit|focal)_(t|s|m|b|l|b\d|s\d)'
#: <model>_<backbone>_<schedule>_<dataset>: epoch schedules on COCO, iteration counts on ADE20K;
#: the demo configs keep the schedule of the config they shrink and name the shapes data
_NAME = re.compile(rf'^(?:(?:cascade_mask_rcnn|mask_rcnn|retinanet)_{_BACKBONE}_(?:1x|3x)_coco'
                   rf'|(?:fpn|upernet)_{_BACKBONE}_\d+k_ade20k'
                   rf'|cls_{_BACKBONE}_\d+e_in1k'
                   rf'|(?:cascade_mask_rcnn|mask_rcnn|retinanet|fpn|upernet|cls)_{_BACKBONE}_'
                   rf'(?:1x|3x|\d+k|\d+e)_shapes)\.py$')


def _bases(path):
    """The ``_base_`` list of a config file, read without running it."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read())
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], 'id', None) == '_base_':
            bases = ast.literal_eval(stmt.value)
            return [bases] if isinstance(bases, str) else bases
    return []


def test_top_level_holds_only_entry_points_bases_demo_and_families():
    entries = set(os.listdir(CONFIG_DIR))
    assert entries == set(ENTRY_POINTS) | {'README.md', '_base_', 'demo'} | set(FAMILIES)
    for family in FAMILIES:  # each family README lists its configs
        with open(osp.join(CONFIG_DIR, family, 'README.md'), encoding='utf-8') as f:
            readme = f.read()
        for path in glob.glob(osp.join(CONFIG_DIR, family, '*.py')):
            assert f'`{osp.basename(path)[:-3]}`' in readme, path


@pytest.mark.parametrize('entry', sorted(ENTRY_POINTS))
def test_entry_point_resolves_to_its_family_config(entry):
    assert _bases(osp.join(CONFIG_DIR, entry)) == ['./' + ENTRY_POINTS[entry]]
    mine = Config.fromfile(osp.join(CONFIG_DIR, entry))
    family = Config.fromfile(osp.join(CONFIG_DIR, ENTRY_POINTS[entry]))
    assert mine.to_dict() == family.to_dict()
    assert mine.pretty_text == family.pretty_text


def test_every_config_follows_the_naming_scheme():
    names = [osp.relpath(c, CONFIG_DIR) for c in CONFIGS if osp.dirname(c) != CONFIG_DIR]
    assert len(names) > 90
    for name in names:
        folder, base = name.split(os.sep)
        assert _NAME.match(base), name
        if folder != 'demo':  # the backbone names the family folder
            assert folder in FAMILIES and f'_{folder}_' in base, name


def test_variants_inherit_the_first_config_of_their_family():
    """A larger variant names one base: a config of its own folder (not mmdet/mmseg bases)."""
    for path in CONFIGS:
        folder = osp.dirname(path)
        if folder == CONFIG_DIR or osp.basename(folder) == 'demo':
            continue
        group, rank = _group_and_rank(path)
        smallest = min(_group_and_rank(p)[1] for p in CONFIGS if _group_and_rank(p)[0] == group)
        bases = _bases(path)
        if rank > smallest:
            assert len(bases) == 1 and bases[0].startswith('./'), (path, bases)
            assert osp.isfile(osp.join(folder, bases[0])), (path, bases)
        for base in bases:  # roots: toolbox bases or shared ones, never another family's config
            assert '::' in base or base.startswith(('./', '../_base_/')), (path, base)


@pytest.mark.parametrize('path', [c for c in CONFIGS if osp.basename(osp.dirname(c)) == 'demo'],
                         ids=lambda p: osp.basename(p))
def test_demo_configs_train_on_the_shapes_data(path):
    """The shapes overrides (_base_/shapes_*_demo.py) are applied and leave no key behind."""
    cfg = Config.fromfile(path)
    assert not [k for k in cfg if k.startswith('shapes_')]
    dataset = cfg.train_dataloader.dataset
    while 'dataset' in dataset:  # RepeatDataset of the 3x recipes
        dataset = dataset.dataset
    for ds in (dataset, cfg.val_dataloader.dataset, cfg.test_dataloader.dataset):
        assert ds.data_root.startswith('data/shapes/'), path
    assert cfg.train_cfg.type == 'IterBasedTrainLoop' and cfg.train_cfg.max_iters == 300
    assert cfg.model.backbone.get('init_cfg') is None
