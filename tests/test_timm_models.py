"""timm entry points of mmeffvit's classifiers (issue 13, item 4).

After ``import mmeffvit``: the official names are listed by ``timm.list_models``; a model's logits
equal those of the mmpretrain classifier under the same weights; official-layout files load
through the tensors-only reader (and a file that would run code is refused); ``features_only``,
``num_classes=0``, ``global_pool=''`` and ``reset_classifier`` behave as in timm. Models are made
small (only widths and depths: the backbone ``arch`` passes through ``create_model``).
"""
import os.path as osp
import sys

import pytest
import timm
import torch

import mmeffvit  # noqa: F401  (registers the entry points)
from mmeffvit.models.timm_models import MODEL_SOURCES

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from cls_cases import (CASES, NUM_CLASSES, build_classifier, official_layout,  # noqa: E402
                       randomise_)
from crafted_checkpoints import official_checkpoint, payloads, save  # noqa: E402

TIMM_CASES = sorted(n for n in CASES if CASES[n]['timm'])


def create(name, **kwargs):
    return timm.create_model(CASES[name]['timm'], arch=CASES[name]['backbone']['arch'], **kwargs)


def test_official_names_are_listed():
    flatten = set(timm.list_models('flatten_*'))
    for arch in ('tiny', 'small', 'medium', 'large'):
        assert f'flatten_pvt_{arch}' in flatten
    assert {f'flatten_pvt_v2_b{i}' for i in range(6)} <= flatten
    assert {'flatten_swin_tiny', 'flatten_swin_small', 'flatten_swin_base',
            'flatten_cswin_tiny', 'flatten_cswin_small', 'flatten_cswin_base'} <= flatten
    assert set(timm.list_models('FLatten_CSWin_*')) == {
        'FLatten_CSWin_64_24181_tiny_224', 'FLatten_CSWin_64_24322_small_224',
        'FLatten_CSWin_96_36292_base_224', 'FLatten_CSWin_96_36292_base_384'}
    assert {'L2ViT_Tiny', 'L2ViT_Small', 'L2ViT_Base'} <= set(timm.list_models('L2ViT_*'))
    assert set(timm.list_models('CARETrans_*')) == {'CARETrans_S0', 'CARETrans_S1',
                                                    'CARETrans_S2'}
    assert 'focal_tiny_patch4_window7_224' in timm.list_models('focal_*')
    assert set(timm.list_models('lavit_*')) == {'lavit_tiny', 'lavit_small', 'lavit_base'}
    assert set(timm.list_models()) >= set(MODEL_SOURCES)


def test_pretrained_cfg():
    model = timm.create_model('flatten_swin_base_384', arch=CASES['flatten_swin']['backbone'][
        'arch'])
    cfg = model.pretrained_cfg
    assert cfg['input_size'] == (3, 384, 384) and cfg['crop_pct'] == 1.0
    cfg = create('flatten_pvt').pretrained_cfg
    assert cfg['input_size'] == (3, 224, 224) and cfg['crop_pct'] == 0.875
    assert cfg['num_classes'] == 1000 and cfg['interpolation'] == 'bicubic'
    assert tuple(cfg['mean']) == (0.485, 0.456, 0.406)
    assert tuple(cfg['std']) == (0.229, 0.224, 0.225)
    data_cfg = timm.data.resolve_data_config({}, model=create('care'))
    assert data_cfg['input_size'] == (3, 224, 224)


@pytest.mark.parametrize('name', TIMM_CASES)
def test_logits_equal_mmpretrain_classifier(name):
    classifier = randomise_(build_classifier(name)).eval()
    model = create(name, num_classes=NUM_CLASSES).eval()
    model.load_state_dict(classifier.state_dict())  # strict: the same names and shapes
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        torch.testing.assert_close(model(x), classifier(x, mode='tensor'))


@pytest.mark.parametrize('name', TIMM_CASES)
def test_official_file_loads(name, tmp_path):
    """An official training file (weights under 'model' beside argparse / yacs objects)."""
    classifier = randomise_(build_classifier(name)).eval()
    path = save(official_checkpoint(official_layout(name, classifier.state_dict())),
                tmp_path / 'official.pth')
    model = create(name, num_classes=NUM_CLASSES, pretrained=True,
                   pretrained_cfg_overlay=dict(file=path)).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), classifier(x, mode='tensor'))


def test_pretrained_other_classes_and_channels(tmp_path):
    """Another num_classes keeps a fresh classifier, in_chans adapts the stem; the rest loads."""
    classifier = randomise_(build_classifier('flatten_swin'))
    path = save({'model': official_layout('flatten_swin', classifier.state_dict())},
                tmp_path / 'o.pth')
    model = create('flatten_swin', num_classes=3, in_chans=1, pretrained=True,
                   pretrained_cfg_overlay=dict(file=path))
    assert model.get_classifier().out_features == 3
    weights = classifier.state_dict()
    for key, value in model.state_dict().items():
        if key == 'backbone.patch_embed.proj.weight':
            assert torch.allclose(value, weights[key].sum(dim=1, keepdim=True))
        elif not key.startswith('head.'):
            assert torch.equal(value, weights[key]), key


def test_pretrained_files_are_checked(tmp_path):
    marker = tmp_path / 'ran'
    evil = save(official_checkpoint({'head.weight': payloads(marker)['reduce_exec']}),
                tmp_path / 'evil.pth')
    with pytest.raises(Exception, match='(?i)unsafe|refus|not allowed'):
        create('flatten_pvt', pretrained=True, pretrained_cfg_overlay=dict(file=evil))
    assert not marker.exists()
    partial = save({'model': {'head.weight': torch.zeros(1000, 64)}}, tmp_path / 'partial.pth')
    with pytest.raises(RuntimeError, match='not in the file'):
        create('flatten_pvt', pretrained=True, pretrained_cfg_overlay=dict(file=partial))
    with pytest.raises(ValueError, match='no weights are hosted'):
        create('flatten_pvt', pretrained=True)


@pytest.mark.parametrize('name', TIMM_CASES)
def test_features_only(name):
    model = create(name, features_only=True).eval()
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    with torch.no_grad():
        feats = model(torch.rand(1, 3, 64, 96))
    assert [f.shape[1] for f in feats] == model.feature_info.channels()
    assert [tuple(f.shape[2:]) for f in feats] == [(16, 24), (8, 12), (4, 6), (2, 3)]
    picked = create(name, features_only=True, out_indices=(1, 3))
    assert picked.feature_info.reduction() == [8, 32]
    with torch.no_grad():
        assert [f.shape[2:] for f in picked(torch.rand(1, 3, 64, 96))] == [(8, 12), (2, 3)]


@pytest.mark.parametrize('name', ['flatten_swin', 'care'])
def test_num_classes_global_pool_and_reset(name):
    x = torch.rand(2, 3, 64, 64)
    model = create(name, num_classes=0).eval()
    with torch.no_grad():
        pooled = model(x)
        assert pooled.shape == (2, model.num_features)
        model.reset_classifier(5)
        assert model(x).shape == (2, 5)
        unpooled = create(name, num_classes=0, global_pool='').eval()(x)
    assert unpooled.shape == (2, model.num_features, 2, 2)
    with pytest.raises(ValueError):
        create(name, num_classes=10, global_pool='')


def test_forward_intermediates_and_features():
    model = randomise_(create('flatten_swin', num_classes=NUM_CLASSES)).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        assert len(maps) == 4 and [m.shape[1] for m in maps] == [16, 32, 64, 128]
        torch.testing.assert_close(final, model.forward_features(x))
        assert not torch.allclose(maps[-1], final)  # the stage maps come before the final norm
        torch.testing.assert_close(model.forward_head(final), model(x))
        last = model.forward_intermediates(x, indices=1, intermediates_only=True)
    assert len(last) == 1 and last[0].shape == (1, 128, 2, 2)
