"""FLatten-PVT: published parameter counts, official checkpoint layouts, mixed precision.

The contract every backbone keeps (names, odd sizes, freezing, loading) is
``test_backbone_contract.py``.
"""
import pytest
import torch

from amp_check import AMP_DTYPES, check_autocast_against_fp32

from mmeffvit.models import FLattenPVT

# official FLatten-PVT counts (parameters of the classification model, 1000-class head included)
OFFICIAL_PARAMS = {'tiny': 12_150_504, 'small': 21.67e6, 'medium': 37.24e6, 'large': 50.65e6}


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def classification_extra(dims=512, classes=1000):
    """The official model's head Linear(512, 1000) and its (unused) final LayerNorm(512)."""
    return dims * classes + classes + 2 * dims


def test_tiny_parameter_count_is_exactly_official():
    assert n_params(FLattenPVT('tiny')) + classification_extra() == OFFICIAL_PARAMS['tiny']


@pytest.mark.parametrize('arch', ['small', 'medium', 'large'])
def test_larger_parameter_counts(arch):
    total = n_params(FLattenPVT(arch)) + classification_extra()
    assert abs(total / 1e6 - OFFICIAL_PARAMS[arch] / 1e6) < 0.005, total


def _official_like_state_dict(model, size=224):
    """A state dict in the official layout: head and final norm included, 224² grids."""
    ref = FLattenPVT('tiny', pretrain_img_size=size)
    sd = {k: torch.randn_like(v) for k, v in ref.state_dict().items()}
    sd['norm.weight'], sd['norm.bias'] = torch.ones(512), torch.zeros(512)
    sd['head.weight'], sd['head.bias'] = torch.zeros(1000, 512), torch.zeros(1000)
    return sd


def test_pretrained_official_layout_loads_and_resizes(tmp_path):
    sd = _official_like_state_dict(None)
    path = tmp_path / 'flatten_pvt_t.pth'
    torch.save({'model': sd, 'epoch': 299}, path)
    # configured for a different pre-training size: position tensors get resized
    model = FLattenPVT('tiny', pretrain_img_size=256,
                       init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    torch.testing.assert_close(model.block2[1].attn.q.weight, sd['block2.1.attn.q.weight'])
    assert model.pos_embed1.shape == (1, 64 * 64, 64)
    assert model.block1[0].attn.positional_encoding.shape == (1, 64 * 64, 64)
    # same size: loaded bit-exactly
    model = FLattenPVT('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    torch.testing.assert_close(model.block1[0].attn.positional_encoding,
                               sd['block1.0.attn.positional_encoding'])


def test_original_pvt_stage4_cls_slot_is_dropped():
    """PVT v1 stores ``pos_embed4`` as ``[cls; 7×7 grid]``: the leading cls slot goes (as in
    mmdet's ``pvt_convert``), the grid stays."""
    grid = torch.randn(1, 49, 512)
    cls_slot = torch.full((1, 1, 512), 7.)
    converted = FLattenPVT('tiny').convert_weights({'pos_embed4': torch.cat([cls_slot, grid], 1)})
    assert torch.equal(converted['pos_embed4'], grid)


@pytest.mark.parametrize('content', [b'', b'not a checkpoint at all'])
def test_pretrained_corrupt_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / 'bad.pth'
    path.write_bytes(content)
    model = FLattenPVT('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match='empty|corrupt'):
        model.init_weights()


@pytest.mark.parametrize('dtype', AMP_DTYPES)
def test_autocast_forward_backward_matches_fp32(dtype):
    # odd size; the focusing function and the attention sums run in fp32 inside, the LayerNorms
    # too (LayerNormFP32: torch's CPU LayerNorm sums its parameter gradients in bf16)
    torch.manual_seed(0)
    model = FLattenPVT('tiny', drop_path_rate=0.)  # both passes must run the same network
    model.init_weights()
    check_autocast_against_fp32(model, torch.rand(1, 3, 97, 131), dtype)
