"""FLatten-PVTv2: official parameter counts, key layout, stage norms, random init, loading.

The contract every backbone keeps is ``test_backbone_contract.py``.
"""
import math

import pytest
import torch

import mmeffvit  # noqa: F401
from mmeffvit.models import FLattenPVTv2

# official FLatten-PVTv2 counts (classification model, 1000-class head included): B0 exact from
# the official definition, the others to 0.01 M (flatten.md sec. 3)
OFFICIAL_B0 = 3_594_824
OFFICIAL_M = {'b1': 12.93, 'b2': 22.55, 'b3': 38.27, 'b4': 51.84, 'b5': 67.06}


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def head_params(dims, classes=1000):
    """The official head Linear(C_4, 1000); norm4 belongs to the backbone."""
    return dims * classes + classes


def test_b0_parameter_count_is_exactly_official():
    model = FLattenPVTv2('b0')
    assert n_params(model) + head_params(256) == OFFICIAL_B0
    # 186 state_dict entries in the official model = ours + head.weight/bias
    assert len(model.state_dict()) + 2 == 186


@pytest.mark.parametrize('arch', list(OFFICIAL_M))
def test_larger_parameter_counts(arch):
    with torch.device('meta'):  # counting only: no memory, no init
        model = FLattenPVTv2(arch)
    total = n_params(model) + head_params(512)
    assert round(total / 1e6, 2) == OFFICIAL_M[arch], total


def test_official_key_layout():
    """Names and shapes of the official B0 state_dict (flatten.md sec. 5)."""
    sd = FLattenPVTv2('b0').state_dict()
    expected = {
        'patch_embed1.proj.weight': (32, 3, 7, 7),
        'patch_embed2.proj.weight': (64, 32, 3, 3),
        'patch_embed4.norm.weight': (256, ),
        'block1.0.attn.q.weight': (32, 32),
        'block1.0.attn.kv.weight': (64, 32),
        'block1.0.attn.proj.weight': (32, 32),
        'block1.0.attn.scale': (1, 1, 32),
        'block1.0.attn.positional_encoding': (1, 56 * 56, 32),
        'block4.1.attn.positional_encoding': (1, 7 * 7, 256),
        'block1.0.attn.dwc.weight': (32, 1, 5, 5),
        'block1.1.mlp.fc1.weight': (256, 32),
        'block1.1.mlp.dwconv.dwconv.weight': (256, 1, 3, 3),
        'block3.0.mlp.fc2.weight': (160, 640),
        'norm1.weight': (32, ),
        'norm4.bias': (256, ),
    }
    for key, shape in expected.items():
        assert tuple(sd[key].shape) == shape, key
    assert not any('.sr.' in k or 'pos_embed' in k for k in sd)


def test_outputs_pass_through_the_stage_norms():
    model = FLattenPVTv2('b0').eval()
    with torch.no_grad():
        outs = model(torch.rand(1, 3, 61, 77))
    # the stage norms (weight 1, bias 0 at init): zero mean over channels
    for o in outs:
        torch.testing.assert_close(o.mean(1), torch.zeros_like(o.mean(1)), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match='patch_sizes > strides'):
        FLattenPVTv2('b0', patch_sizes=(4, 2, 2, 2))


def test_official_random_init():
    model = FLattenPVTv2('b0')
    model.init_weights()
    conv = model.patch_embed1.proj  # fan_out = 7*7*32
    assert abs(conv.weight.std().item() - math.sqrt(2 / (49 * 32))) < 0.005
    dw = model.block1[0].mlp.dwconv.dwconv  # depthwise: fan_out = 3*3
    assert abs(dw.weight.std().item() - math.sqrt(2 / 9)) < 0.03
    assert torch.count_nonzero(dw.bias) == 0
    assert abs(model.block2[0].attn.q.weight.std().item() - 0.02) < 0.002
    assert torch.all(model.norm3.weight == 1)
    assert torch.count_nonzero(model.block1[0].attn.positional_encoding) == 0


def _official_state_dict():
    """Official layout at 224: our names plus the classifier head."""
    torch.manual_seed(0)
    sd = {k: torch.randn_like(v) for k, v in FLattenPVTv2('b0').state_dict().items()}
    sd['head.weight'], sd['head.bias'] = torch.zeros(1000, 256), torch.zeros(1000)
    return sd


def test_pretrained_official_layout_loads_and_resizes(tmp_path):
    sd = _official_state_dict()
    path = tmp_path / 'flatten_pvt_v2_b0.pth'
    torch.save({'model': sd, 'epoch': 299}, path)
    model = FLattenPVTv2('b0', pretrain_img_size=256,
                         init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert model.block1[0].attn.positional_encoding.shape == (1, 64 * 64, 32)
    assert model.block4[1].attn.positional_encoding.shape == (1, 8 * 8, 256)
    torch.testing.assert_close(model.block2[1].mlp.dwconv.dwconv.weight,
                               sd['block2.1.mlp.dwconv.dwconv.weight'])
    torch.testing.assert_close(model.norm4.weight, sd['norm4.weight'])
    # same resolution: every tensor bit-exact
    model = FLattenPVTv2('b0', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    for key, value in model.state_dict().items():
        assert torch.equal(value, sd[key]), key
