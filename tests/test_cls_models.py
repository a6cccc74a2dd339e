"""mmpretrain classifiers of every family (issue 13, item 1, model side).

The model bases ``configs/_base_/models/cls_*.py`` build at full size with the official
parameter counts; made small (widths and depths only), each classifier trains (loss, a gradient
in every trainable parameter) and predicts at 224² and at an odd size, its logits equal the
official head re-implemented with plain torch ops on the backbone's raw last-stage features, and
official-layout checkpoints convert onto it (``convert_classifier_weights`` and
``tools/model_converters/official2mmpretrain.py``).
"""
import os.path as osp
import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip('mmpretrain')
from mmpretrain.structures import DataSample  # noqa: E402

import mmeffvit  # noqa: F401,E402

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from cls_cases import (CASES, NUM_CLASSES, ROOT, build_classifier,  # noqa: E402
                       config_path, official_layout, randomise_, reference_logits)
from crafted_checkpoints import official_checkpoint, payloads, save  # noqa: E402

sys.path.insert(0, osp.join(ROOT, 'tools', 'model_converters'))
import official2mmpretrain  # noqa: E402

WITH_CONFIG = sorted(n for n in CASES if CASES[n]['config'])
# parameters of the official classifiers (reference notes: FLatten tables, CARE's count with both
# heads, L2ViT and Focal model tables), millions, 2 decimals
OFFICIAL_PARAMS = {'flatten_pvtv2': 3.59, 'flatten_swin': 29.19, 'flatten_cswin': 21.20,
                   'care': 7.34, 'l2vit': 28.60, 'focal': 28.88}


@pytest.mark.parametrize('name', sorted(OFFICIAL_PARAMS))
def test_model_base_has_official_size(name):
    model = build_classifier(name, small=False)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    assert round(params, 2) == OFFICIAL_PARAMS[name]


def test_every_required_model_base_exists():
    for base in ('flatten_pvtv2_b0', 'flatten_swin_t', 'flatten_cswin_t', 'lavit_t', 'lavit_s',
                 'care_s0', 'l2vit_t', 'focal_t'):
        assert osp.isfile(osp.join(ROOT, 'configs', '_base_', 'models', f'cls_{base}.py'))


def _samples(n):
    return [DataSample().set_gt_label(i % NUM_CLASSES) for i in range(n)]


@pytest.mark.parametrize('size', [(224, 224), (57, 83)], ids=['224', 'odd'])
@pytest.mark.parametrize('name', sorted(CASES))
def test_loss_gradients_and_predict(name, size):
    torch.manual_seed(0)
    model = build_classifier(name)
    model.init_weights()
    model.train()
    losses = model(torch.rand(1, 3, *size), _samples(1), mode='loss')
    assert all(torch.isfinite(v).all() for v in losses.values()), losses
    if name == 'lavit':
        assert 'loss_diag' in losses  # LaViT's diagonality loss (sec. 3.4) joins the sum
    sum(v for k, v in losses.items() if 'loss' in k).backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad
    model.eval()
    with torch.no_grad():
        preds = model(torch.rand(1, 3, *size), _samples(1), mode='predict')
    assert preds[0].pred_score.shape == (NUM_CLASSES, )
    assert torch.allclose(preds[0].pred_score.sum(), torch.tensor(1.))


@pytest.mark.parametrize('name', sorted(n for n in CASES if CASES[n]['head'] != 'cls_token'))
def test_logits_equal_official_head(name):
    model = randomise_(build_classifier(name)).eval()
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        logits = model(x, mode='tensor')
        expected = reference_logits(name, model.backbone, model.state_dict(), x)
    assert logits.shape == (2, NUM_CLASSES)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_deit_logits_equal_official_head():
    """DeiT's classifier: final LayerNorm (eps 1e-6) over the tokens, the cls token, linear."""
    model = randomise_(build_classifier('flatten_deit')).eval()
    weights = model.state_dict()
    x = torch.rand(2, 3, 64, 96)
    model.backbone.out_type = 'raw'
    norm, model.backbone.norm = model.backbone.norm, None
    with torch.no_grad():
        tokens = model.backbone(x)[-1]
        model.backbone.norm, model.backbone.out_type = norm, 'cls_token'
        logits = model(x, mode='tensor')
    cls = F.layer_norm(tokens, tokens.shape[-1:], weights['backbone.norm.weight'],
                       weights['backbone.norm.bias'], 1e-6)[:, 0]
    expected = F.linear(cls, weights['head.fc.weight'], weights['head.fc.bias'])
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_final_norm_options_are_checked():
    from mmpretrain.registry import MODELS
    with pytest.raises(ValueError, match='out_indices must'):
        MODELS.build(dict(CASES['flatten_swin']['backbone'], type='FLattenSwin',
                          final_norm=True, out_indices=(1, 2)))
    with pytest.raises(TypeError, match='final_norm'):  # PVT v1's classifier has no final norm
        MODELS.build(dict(CASES['flatten_pvt']['backbone'], final_norm=True))


@pytest.mark.parametrize('name', sorted(CASES))
def test_official_checkpoint_converts(name):
    """The official names (reverse of the conversion, written in the test) map back exactly."""
    model = randomise_(build_classifier(name))
    weights = model.state_dict()
    converted = model.backbone.convert_classifier_weights(official_layout(name, weights))
    assert sorted(converted) == sorted(weights)
    for key, value in weights.items():
        assert torch.equal(converted[key], value), key


@pytest.mark.parametrize('name', ['flatten_swin', 'care'])
def test_converter_tool(name, tmp_path):
    """tools/model_converters/official2mmpretrain.py: an official training file (argparse and
    yacs objects beside the weights) -> a checkpoint that gives the same logits."""
    model = randomise_(build_classifier(name)).eval()
    src = save(official_checkpoint(official_layout(name, model.state_dict())),
               tmp_path / 'official.pth')
    config = tmp_path / 'small.py'  # the model base, made small by a child config
    config.write_text(f'_base_ = [{config_path(name)!r}]\nmodel = dict(backbone=dict(arch=dict('
                      f'_delete_=True, **{CASES[name]["backbone"]["arch"]!r})))\n')
    dst = tmp_path / 'cls.pth'
    meta = official2mmpretrain.main(
        [str(config), src, str(dst), '--cfg-options', f'model.head.num_classes={NUM_CLASSES}',
         f'model.head.in_channels={model.head.fc.in_features}'])
    assert meta['dropped_keys'] == [] and meta['kept_head'] == []
    fresh = build_classifier(name).eval()
    fresh.load_state_dict(torch.load(dst, weights_only=True)['state_dict'])
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x, mode='tensor'), model(x, mode='tensor'))


def test_converter_tool_refuses_code_and_misfits(tmp_path):
    marker = tmp_path / 'ran'
    src = save(official_checkpoint({'head.weight': payloads(marker)['reduce_exec']}),
               tmp_path / 'evil.pth')
    with pytest.raises(Exception, match='(?i)unsafe|refus|not allowed'):
        official2mmpretrain.convert(config_path('flatten_swin'), src, str(tmp_path / 'o.pth'))
    assert not marker.exists()
    src = save({'model': {'head.weight': torch.zeros(1000, 768)}}, tmp_path / 'partial.pth')
    with pytest.raises(RuntimeError, match='not in the file'):
        official2mmpretrain.convert(config_path('flatten_swin'), src, str(tmp_path / 'o.pth'))
