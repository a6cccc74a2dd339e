"""The model zoo: docs/model_zoo.md (and the model index, tests/test_model_index.py) is what
tools/analysis/model_zoo.py generates from the code, and tools/model_converters/flatten2mmeffvit.py
turns official releases into loadable files."""
import argparse
import importlib.util
import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config

import mmeffvit  # noqa: F401
from mmeffvit.analysis.zoo.configs import read_config
from mmeffvit.analysis.zoo.counts import CountCache, count_config, count_model, model_key
from mmeffvit.registry import MODELS
from mmeffvit.models import FLattenCSWin, FLattenDeiT, FLattenPVT, FLattenPVTv2, FLattenSwin
from mmeffvit.utils import load_checkpoint_file

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _load(*parts):
    path = osp.join(REPO_ROOT, 'tools', *parts)
    spec = importlib.util.spec_from_file_location('_tool_' + parts[-1][:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


zoo = _load('analysis', 'model_zoo.py')
converter = _load('model_converters', 'flatten2mmeffvit.py')


@pytest.fixture(scope='module')
def doc_rows():
    with open(zoo.DOC, encoding='utf-8') as f:
        text = f.read()
    rows = zoo.parse_table(text)
    assert zoo.render(rows) == text, 'docs/model_zoo.md was edited by hand: regenerate it'
    return {row['model']: row for row in rows}


@pytest.fixture(scope='module')
def cached():
    with open(zoo.COUNTS, encoding='utf-8') as f:
        return json.load(f)


# --- the generated files ---------------------------------------------------------------------

def test_every_generated_file_is_up_to_date(capsys):
    """docs/model_zoo.md, model-index.yml, the metafiles and the README sections, regenerated
    from the configs, the code and the cached counts: the same text."""
    assert zoo.main(['--check']) == 0, capsys.readouterr().out[-3000:]


def test_every_variant_and_family_config_is_in_the_table(doc_rows):
    assert list(doc_rows) == [v.name for v in zoo.variants()]
    sections = {zoo.section_of(name) for name in doc_rows}
    assert sections == set(zoo.FAMILIES.values())  # all five families, not only FLatten
    names = [n for n, _, _ in zoo.config_index(zoo.CONFIG_DIR)]
    listed = [c.strip('`') for r in doc_rows.values() for c in r['configs'].split('<br>')
              if c != '–']
    assert sorted(listed) == sorted(names)  # each config in exactly one row


@pytest.mark.parametrize('key', [
    "classifier:FLattenPVTv2(arch='b0')@224x224",
    "backbone:CARE(arch='s0')@512x512",
])
def test_some_cached_counts_match_a_fresh_count(cached, key):
    """The cache holds what mmeffvit.analysis counts (all of it: the slow test below)."""
    kind, rest = key.split(':', 1)
    type_name, rest = rest.split('(', 1)
    shape = tuple(int(v) for v in rest.rsplit('@', 1)[1].split('x'))
    arch = rest.split("'")[1]
    assert model_key(kind, type_name, dict(arch=arch), shape) == key
    assert count_model(kind, type_name, dict(arch=arch), shape) == cached['backbones'][key]


def test_a_cached_whole_model_count_matches_a_fresh_count(cached):
    name = 'care/fpn_care_s0_40k_ade20k'
    fresh = count_config(osp.join(zoo.CONFIG_DIR, name + '.py'))
    assert fresh['params'] == cached['models'][name]['params']


def test_check_fails_on_missing_or_stale_counts(tmp_path):
    """A changed config (new fingerprint) or backbone (new key) is reported, not read."""
    counts = CountCache(str(tmp_path / 'none.json'))
    assert counts.backbone('backbone', 'CARE', dict(arch='s0'), (64, 64)) is None
    assert counts.config('care/x', 'x.py', 'abc') is None
    assert counts.missing == ["backbone:CARE(arch='s0')@64x64", 'care/x']
    path = tmp_path / 'counts.json'
    path.write_text(json.dumps({'backbones': {}, 'models': {
        'care/x': {'fingerprint': 'old', 'params': 1}}}))
    counts = CountCache(str(path))
    assert counts.config('care/x', 'x.py', 'new') is None and counts.missing == ['care/x']
    entry = CountCache(str(path)).config('care/x', 'x.py', 'old')
    assert entry == {'fingerprint': 'old', 'params': 1}


def test_defaults_restated_by_a_config_share_the_entry():
    counts = CountCache('/nonexistent.json')
    counts.backbone('backbone', 'L2ViT', dict(arch='tiny', out_indices=[0, 1, 2, 3]), (8, 8))
    counts.backbone('backbone', 'L2ViT', dict(arch='tiny', out_indices=(1, 2, 3)), (8, 8))
    assert counts.missing == ["backbone:L2ViT(arch='tiny')@8x8",
                              "backbone:L2ViT(arch='tiny', out_indices=(1, 2, 3))@8x8"]


def test_official_reference_figures_appear_in_the_table(doc_rows):
    """Counts the reference notes derived from the official code (flatten.md sec. 3, care.md
    sec. 7, l2vit.md sec. 3, focal.md sec. 3; LaViT: its README's reconstruction notes), read
    back from the generated file."""
    assert doc_rows['FLatten-Swin-T']['cls_gmacs'] == '4.48'
    assert doc_rows['FLatten-CSWin-T']['cls_params'] == '21.20'
    assert doc_rows['FLatten-PVTv2-B0']['cls_gmacs'] == '0.58'
    assert doc_rows['FLatten-Swin-B@384']['cls_params'] == '91.43'
    assert (doc_rows['CARE-S0']['cls_params'], doc_rows['CARE-S0']['cls_gmacs']) == ('7.34', '0.72')
    assert doc_rows['CARE-S2']['cls_params'] == '19.48'
    assert doc_rows['L2ViT-T']['cls_params'] == '28.60'
    assert doc_rows['Focal-T']['cls_params'] == '28.88'
    assert doc_rows['Focal-B-conv']['cls_params'] == '93.27'
    lavit_t = doc_rows['LaViT-T']
    assert (lavit_t['cls_params'], lavit_t['cls_gmacs']) == ('11.04', '1.81')


@pytest.mark.parametrize('name', ['flatten/mask_rcnn_flatten_pvtv2_b1_1x_coco',
                                  'flatten/upernet_flatten_cswin_s_160k_ade20k',
                                  'flatten/upernet_flatten_swin_t_160k_ade20k',
                                  'flatten/mask_rcnn_flatten_pvt_t_3x_coco',
                                  'lavit/retinanet_lavit_s_3x_coco',
                                  'care/fpn_care_s1_40k_ade20k',
                                  'l2vit/retinanet_l2vit_b_1x_coco',
                                  'focal/cascade_mask_rcnn_focal_t_3x_coco'])
def test_config_reader_agrees_with_mmengine(name):
    """The literal reading of a config (with local ``_base_`` inheritance and the backbone taken
    with ``_base_.pop``) vs mmengine's Config."""
    path = osp.join(REPO_ROOT, 'configs', name + '.py')
    cfg = Config.fromfile(path)
    mine = read_config(path)
    backbone = {k: v for k, v in mine['model']['backbone'].items() if k != '_delete_'}
    assert backbone == cfg.model.backbone.to_dict()
    assert mine['pretrained'] == cfg.pretrained
    assert 'backbone' not in mine and 'backbone' not in cfg  # popped from the bases


@pytest.mark.slow
def test_full_recount_gives_the_cached_numbers(capsys):
    """Every count again (every variant at its ImageNet size and 800×1333, every config's
    backbone and whole model): about an hour on a 2-core CPU."""
    assert zoo.main(['--check', '--recount']) == 0, capsys.readouterr().out[-3000:]


# --- the checkpoint converter ------------------------------------------------------------------

def _official_like(family):
    """A state dict in the official layout of the smallest variant, classifier included."""
    torch.manual_seed(0)
    if family == 'pvt':
        model, dims, extra = FLattenPVT('tiny'), 512, ('norm', 'head')
    elif family == 'pvt_v2':
        model, dims, extra = FLattenPVTv2('b0'), 256, ('head', )
    elif family == 'swin':
        model, dims, extra = FLattenSwin('tiny', out_indices=(3, )), 768, ('head', )
    elif family == 'cswin':
        model, dims, extra = FLattenCSWin('tiny', out_norm=False), 512, ('norm', 'head')
    else:
        model, dims, extra = FLattenDeiT('tiny'), 192, ('head', )
    sd = {k: torch.randn(v.shape) if v.is_floating_point() else v.clone()
          for k, v in model.state_dict().items()}
    if family == 'swin':  # the official final norm is our norm3; shifted blocks keep masks
        sd['norm.weight'], sd['norm.bias'] = sd.pop('norm3.weight'), sd.pop('norm3.bias')
        sd['layers.2.blocks.1.attn_mask'] = torch.zeros(4, 49, 49)
    if 'norm' in extra and 'norm.weight' not in sd:
        sd['norm.weight'], sd['norm.bias'] = torch.ones(dims), torch.zeros(dims)
    sd['head.weight'], sd['head.bias'] = torch.randn(1000, dims), torch.randn(1000)
    return sd


EXPECTED_MISSING = {
    'pvt': [], 'pvt_v2': [], 'deit': [],
    'swin': [f'norm{i}.{p}' for i in range(4) for p in ('weight', 'bias')],
    'cswin': [f'norm{i}.{p}' for i in range(4) for p in ('weight', 'bias')],
}


@pytest.mark.parametrize('family,arch', [('pvt', 'tiny'), ('pvt_v2', 'b0'), ('swin', 'tiny'),
                                         ('cswin', 'tiny'), ('deit', 'tiny')])
def test_converter_round_trip(tmp_path, family, arch):
    """Official file (with a non-tensor object) -> converted file -> fresh backbone, bit-exact."""
    sd = _official_like(family)
    src, dst = tmp_path / 'official.pth', tmp_path / 'out' / 'converted.pth'
    torch.save({'model': sd, 'epoch': 299, 'config': argparse.Namespace(lr=1e-3)}, src)
    # family and arch inferred for the first three, given for the last two
    given = dict(family=family, arch=arch) if family in ('cswin', 'deit') else {}
    meta = converter.convert(str(src), str(dst), verbose=False, **given)
    assert meta['family'] == family and meta['backbone']['arch'] == arch
    assert sorted(meta['missing_keys']) == sorted(EXPECTED_MISSING[family])
    assert meta['unexpected_keys'] == [] and meta['resized_keys'] == []
    assert {'head.weight', 'head.bias'} <= set(meta['dropped_keys'])

    ckpt = load_checkpoint_file(str(dst), trust=False)  # plain tensors and primitives only
    assert set(ckpt) == {'state_dict', 'meta'}
    assert all(k.startswith('backbone.') for k in ckpt['state_dict'])
    # meta['backbone'] is a buildable config of the matching backbone
    model = MODELS.build(dict(meta['backbone'],
                              init_cfg=dict(type='Pretrained', checkpoint=str(dst))))
    model.init_weights()
    own = model.state_dict()
    for key, value in ckpt['state_dict'].items():
        name = key[len('backbone.'):]
        assert torch.equal(own[name], value), name
        if name in sd and sd[name].is_floating_point():
            assert torch.equal(own[name], sd[name]), name


def _converted_b0(tmp_path):
    sd = _official_like('pvt_v2')
    src, dst = tmp_path / 'b0.pth', tmp_path / 'b0_mm.pth'
    torch.save({'model': sd}, src)
    converter.main([str(src), str(dst)])
    return sd, dst


def test_converted_file_loads_into_a_detector_layout(tmp_path):
    """As ``load_from`` of a detector: mmengine's loader puts ``backbone.*`` in place."""
    from mmengine.runner import load_checkpoint
    sd, dst = _converted_b0(tmp_path)

    class Detector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = FLattenPVTv2('b0')

    det = Detector()
    load_checkpoint(det, str(dst), strict=True)
    assert torch.equal(det.backbone.block2[1].attn.kv.weight, sd['block2.1.attn.kv.weight'])


def test_converted_file_loads_with_the_backbone_prefix(tmp_path):
    sd, dst = _converted_b0(tmp_path)
    model = FLattenPVTv2('b0', init_cfg=dict(type='Pretrained', checkpoint=str(dst),
                                             prefix='backbone.'))
    model.init_weights()
    assert torch.equal(model.block4[0].mlp.fc2.weight, sd['block4.0.mlp.fc2.weight'])


def test_converter_resizes_to_another_size_and_infers_the_window(tmp_path):
    sd = _official_like('swin')
    src, dst = tmp_path / 'swin.pth', tmp_path / 'swin_256.pth'
    torch.save({'model': sd}, src)
    meta = converter.convert(str(src), str(dst), img_size=256, verbose=False)
    assert meta['backbone'] == dict(type='FLattenSwin', arch='tiny', pretrain_img_size=256,
                                    window_size=7)
    state = load_checkpoint_file(str(dst))['state_dict']
    assert state['backbone.layers.0.blocks.0.attn.positional_encoding'].shape == (1, 64 * 64, 96)
    assert 'layers.0.blocks.0.attn.positional_encoding' in meta['resized_keys']
    assert 'layers.2.blocks.1.attn_mask' in meta['dropped_keys']


def test_converter_errors(tmp_path):
    src = tmp_path / 'odd.pth'
    torch.save({'model': {'something.weight': torch.zeros(2)}}, src)
    with pytest.raises(ValueError, match='--family'):
        converter.convert(str(src), str(tmp_path / 'x.pth'), verbose=False)
    torch.save({'model': _official_like('pvt_v2')}, src)
    with pytest.raises(KeyError, match='state_dict_ema'):
        converter.convert(str(src), str(tmp_path / 'x.pth'), ema=True, verbose=False)
    with pytest.raises(ValueError, match='does not fit'):
        converter.convert(str(src), str(tmp_path / 'x.pth'), family='pvt_v2', arch='b1',
                          verbose=False)
