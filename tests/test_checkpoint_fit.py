"""Wrong checkpoints stop with an error that says what the file is (issue 11, item 2).

In process, through mmengine's ``load_checkpoint`` (the function behind ``load_from``,
``tools/test.py``, ``--resume``, the toolboxes' scripts and Inferencers) and through
``init_cfg=Pretrained``; the command-line paths are in ``test_checkpoint_cli.py``.
"""
import os.path as osp
import sys

import pytest
import torch
from mmengine.runner.checkpoint import load_checkpoint

import mmeffvit  # noqa: F401  (installs the fit check)
import mmeffvit.utils.checkpoint_fit as fit
from mmeffvit.models import FLattenPVT, FLattenPVTv2, FLattenSwin, LaViT
from mmeffvit.utils.checkpoint_fit import CheckpointMismatchError, check_fit, recognise, shapes_of

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from crafted_checkpoints import build_segmentor  # noqa: E402

SWIN_RUN = 'fpn_flatten_swin_t_shapes_20260101_120000'


@pytest.fixture(scope='module')
def pvt_fpn():
    return build_segmentor()[0]


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    """A FLatten-Swin-T Semantic FPN run file (with its meta), a FLatten-PVT-T one, a backbone
    file without prefix and a file that matches nothing."""
    root = tmp_path_factory.mktemp('fit')
    swin, cfg = build_segmentor(dict(type='FLattenSwin', arch='tiny', init_cfg=None),
                                [96, 192, 384, 768])
    paths = dict(swin_fpn=root / 'swin_fpn.pth', pvt_fpn=root / 'pvt_fpn.pth',
                 swin_backbone=root / 'swin_t.pth', nomatch=root / 'nomatch.pth')
    torch.save({'state_dict': swin.state_dict(),
                'meta': {'experiment_name': SWIN_RUN, 'cfg': cfg.pretty_text}},
               paths['swin_fpn'])
    torch.save({'state_dict': build_segmentor()[0].state_dict()}, paths['pvt_fpn'])
    torch.save(swin.backbone.state_dict(), paths['swin_backbone'])
    torch.save({'state_dict': {'foo.weight': torch.ones(3), 'bar.bias': torch.zeros(2)}},
               paths['nomatch'])
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture
def logged(monkeypatch):
    lines = []
    monkeypatch.setattr(fit, 'print_log', lambda msg, logger=None, level=None: lines.append(msg))
    return lines


def test_file_matching_nothing(pvt_fpn, files):
    with pytest.raises(CheckpointMismatchError) as info:
        load_checkpoint(pvt_fpn, files['nomatch'])
    msg = str(info.value)
    assert files['nomatch'] in msg and '0 of its 217 tensors would load' in msg
    assert 'backbone. (164)' in msg and 'foo. (1)' in msg


def test_swin_segmentor_into_pvt_config(pvt_fpn, files):
    before = {k: v.clone() for k, v in pvt_fpn.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as info:
        load_checkpoint(pvt_fpn, files['swin_fpn'])
    msg = str(info.value)
    assert "the model's backbone (FLatten-PVT-T): 0 of its 164 tensors would load" in msg
    assert 'the file is a FLatten-Swin-T checkpoint' in msg
    assert 'fpn_flatten_swin_t_shapes' in msg and 'backbone FLatten-Swin-T' in msg
    assert msg.endswith('the config builds FLatten-PVT-T.')
    assert 'layers. (185)' in msg and 'block1. (36)' in msg
    # nothing was loaded before the error (the decoder would have fitted)
    assert all(torch.equal(v, before[k]) for k, v in pvt_fpn.state_dict().items())


def test_backbone_file_as_whole_model_weights(pvt_fpn, files):
    with pytest.raises(CheckpointMismatchError, match=r"FLatten-Swin-T checkpoint; the config "
                       r"builds FLatten-PVT-T; to use backbone weights.*init_cfg"):
        load_checkpoint(pvt_fpn, files['swin_backbone'])


def test_partial_match_loads_and_counts(files, logged):
    """A segmentor with another number of classes: the classifier differs, the rest loads."""
    model, _ = build_segmentor(num_classes=4)
    load_checkpoint(model, files['pvt_fpn'])
    assert logged == [f'checkpoint {files["pvt_fpn"]}: 215 of 217 tensors loaded']
    source = torch.load(files['pvt_fpn'])['state_dict']
    assert torch.equal(model.backbone.pos_embed1, source['backbone.pos_embed1'])


def test_full_match_counts(pvt_fpn, files, logged):
    load_checkpoint(pvt_fpn, files['pvt_fpn'])
    assert logged == [f'checkpoint {files["pvt_fpn"]}: 217 of 217 tensors loaded']


@pytest.mark.parametrize('name,expected', [
    ('swin_fpn', r'a FLatten-Swin-T checkpoint \(written by an mmengine run of '
     r'fpn_flatten_swin_t_shapes, backbone FLatten-Swin-T\); the config builds FLatten-PVT-T'),
    ('swin_backbone', 'a FLatten-Swin-T checkpoint; the config builds FLatten-PVT-T'),
    ('nomatch', '0 of its 164 tensors would load')])
def test_pretrained_init_names_the_file(files, name, expected):
    backbone = FLattenPVT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=files[name]))
    with pytest.raises(CheckpointMismatchError, match=expected):
        backbone.init_weights()


@pytest.mark.parametrize('file_arch,model_arch', [('small', 'tiny'), ('tiny', 'small')])
def test_pretrained_init_refuses_another_depth(tmp_path, file_arch, model_arch):
    """Every tensor of PVT-T exists in PVT-S with the same shape: still the wrong file."""
    path = str(tmp_path / 'pvt.pth')
    torch.save(FLattenPVT(arch=file_arch).state_dict(), path)
    backbone = FLattenPVT(arch=model_arch, init_cfg=dict(type='Pretrained', checkpoint=path))
    short = dict(tiny='T', small='S')
    with pytest.raises(CheckpointMismatchError, match=f'a FLatten-PVT-{short[file_arch]} '
                       f'checkpoint; the config builds FLatten-PVT-{short[model_arch]}'):
        backbone.init_weights()


@pytest.mark.parametrize('cls,arch,name', [
    (FLattenSwin, 'small', 'FLatten-Swin-S'), (FLattenPVTv2, 'b1', 'FLatten-PVTv2-B1'),
    (LaViT, 'tiny', 'LaViT-T'), (FLattenPVT, 'medium', 'FLatten-PVT-M')])
def test_recognise_from_real_weights(cls, arch, name):
    """Signatures are built with large tensors on the meta device: compare with real models."""
    assert recognise(shapes_of(cls(arch=arch).state_dict())) == name


def test_recognise_unknown():
    assert recognise({'foo.weight': (3, 3)}) is None
    assert recognise({}) is None


def test_meta_is_read_without_running_the_config():
    text = ("model = dict(backbone=dict(arch='tiny', init_cfg=dict(type='Pretrained', "
            "checkpoint='x.pth'), type='mmeffvit.FLattenSwin'), neck=dict(type='FPN'))\n"
            "__import__('os').system('false')\n")
    assert fit.describe_meta({'experiment_name': 'a_b_20260101_120000', 'cfg': text}) == \
        'written by an mmengine run of a_b, backbone FLatten-Swin-T'
    assert fit.describe_meta({'cfg': 'model = dict(type="X")'}) == ''
    assert fit.describe_meta(None) == ''


def test_check_fit_rules():
    """Whole model: error only when nothing loads or most shared keys differ in shape."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    own = model.state_dict()
    partial = dict(own, **{'1.weight': torch.ones(3, 4), '1.bias': torch.ones(3)})
    assert check_fit(model, partial).line() == '2 of 4 tensors loaded'
    with pytest.raises(CheckpointMismatchError, match='3 differ in shape'):
        check_fit(model, dict(partial, **{'0.bias': torch.ones(5)}))
    with pytest.raises(CheckpointMismatchError, match='1 differ in shape'):
        check_fit(model, dict(own, **{'1.bias': torch.ones(3)}), is_backbone=True)
