"""Every config builds in its toolbox, runs a forward pass and computes its losses."""
import glob
import json
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

# the default run checks the smallest variant of each detector/segmentor + family; the larger
# variants (same code, more and wider layers) run with -m slow
_SIZE_RANK = {'t': 0, 'b0': 0, 's0': 0, 's': 1, 'b1': 1, 's1': 1, 'm': 2, 'b2': 2, 's2': 2,
              'b': 3, 'l': 3}


def _group_and_rank(path):
    stem = osp.splitext(osp.basename(path))[0]
    match = re.match(r'(.+?)_(t|s|m|b|l|b\d|s\d)_(.+)$', stem)
    if match is None:
        return stem, 0
    return f'{match.group(1)}_{match.group(3)}', _SIZE_RANK[match.group(2)]


def _params():
    best = {}
    for path in CONFIGS:
        group, rank = _group_and_rank(path)
        best[group] = min(best.get(group, rank), rank)
    params = []
    for path in CONFIGS:
        group, rank = _group_and_rank(path)
        marks = () if rank == best[group] else (pytest.mark.slow, )
        params.append(pytest.param(path, marks=marks, id=osp.relpath(path, ROOT)))
    return params


# configs that differ only in schedule or data (1x / 3x) share a model: check each model once
_CHECKED_MODELS = {}


def load(path):
    cfg = Config.fromfile(path)
    # no ImageNet weights in tests; the Pretrained path is covered by the backbone tests
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


@pytest.mark.parametrize('path', _params())
def test_config_builds_and_computes_losses(path):
    cfg = load(path)
    scope = cfg.default_scope
    key = scope + json.dumps(cfg.model.to_dict(), sort_keys=True, default=str)
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
    else:
        pytest.fail(f'unexpected default_scope {scope}')
    total, log_vars = model.parse_losses(losses)
    assert torch.isfinite(total)
    total.backward()
    backbone_grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert all(g is not None for g in backbone_grads), 'a backbone parameter got no gradient'


def test_both_main_configs_are_present():
    names = {osp.basename(c) for c in CONFIGS}
    assert {'mask_rcnn_flatten_pvt_t_1x.py', 'fpn_flatten_pvt_t_80k_ade20k.py'} <= names
