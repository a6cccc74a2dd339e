"""FLatten-PVTv2: official parameter counts, layout, any input size, freezing, loading."""
import math

import pytest
import torch
from mmengine.registry import init_default_scope

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


def test_odd_input_size_gives_strided_maps():
    model = FLattenPVTv2('b0').eval()
    with torch.no_grad():
        outs = model(torch.rand(1, 3, 333, 517))
    shapes = [tuple(o.shape) for o in outs]
    assert shapes == [(1, 32, 84, 130), (1, 64, 42, 65), (1, 160, 21, 33), (1, 256, 11, 17)]
    assert all(torch.isfinite(o).all() for o in outs)
    # outputs pass through the stage norms (weight 1, bias 0 at init): zero mean over channels
    for o in outs:
        torch.testing.assert_close(o.mean(1), torch.zeros_like(o.mean(1)), atol=1e-4, rtol=0)


def test_out_indices_and_bad_values():
    model = FLattenPVTv2('b0', out_indices=(1, 3)).eval()
    with torch.no_grad():
        outs = model(torch.rand(1, 3, 64, 96))
    assert [o.shape[1] for o in outs] == [64, 256]
    with pytest.raises(ValueError, match='out_indices'):
        FLattenPVTv2('b0', out_indices=(4, ))
    with pytest.raises(ValueError, match='patch_sizes > strides'):
        FLattenPVTv2('b0', patch_sizes=(4, 2, 2, 2))


def test_unknown_arch_lists_names_closest_first():
    with pytest.raises(KeyError) as err:
        FLattenPVTv2('b6')
    msg = str(err.value)
    assert "'b6'" in msg and 'b0' in msg and msg.index('b0') < msg.index('pvt_v2_b0')


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


def test_frozen_stages_really_frozen():
    model = FLattenPVTv2('b0', frozen_stages=2)
    model.train()
    frozen = [model.patch_embed1, model.block1, model.norm1, model.patch_embed2, model.block2,
              model.norm2]
    for mod in frozen:
        assert not mod.training
        assert all(not p.requires_grad for p in mod.parameters())
    assert model.block3.training and all(p.requires_grad for p in model.patch_embed3.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    sum(o.sum() for o in model(torch.rand(2, 3, 64, 64))).backward()
    opt.step()
    after = model.state_dict()
    for k in before:
        if k.startswith(('patch_embed1', 'block1', 'norm1', 'patch_embed2', 'block2', 'norm2')):
            assert torch.equal(before[k], after[k]), k
    assert not torch.equal(before['block3.0.mlp.fc1.weight'], after['block3.0.mlp.fc1.weight'])
    with pytest.raises(ValueError, match='frozen_stages'):
        FLattenPVTv2('b0', frozen_stages=5)


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


def test_pretrained_wrong_architecture_is_a_clear_error(tmp_path):
    path = tmp_path / 'b1.pth'
    torch.save(FLattenPVTv2('b1').state_dict(), path)
    model = FLattenPVTv2('b0', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match='does not fit'):
        model.init_weights()


def test_bf16_autocast_forward_backward_finite():
    model = FLattenPVTv2('b0')
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.rand(1, 3, 96, 128))
    loss = sum(o.float().mean() for o in outs)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
@pytest.mark.parametrize('name', ['FLattenPVTv2', 'mmeffvit.FLattenPVTv2'])
def test_builds_by_plain_and_scoped_name(scope, name):
    init_default_scope(scope)
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    model = registry.build(dict(type=name, arch='b0', out_indices=(3, )))
    assert type(model).__name__ == 'FLattenPVTv2'
    with torch.no_grad():
        (out, ) = model.eval()(torch.rand(1, 3, 45, 61))
    assert out.shape == (1, 256, 2, 2)
