"""FLatten-PVT: published parameter counts, any input size, freezing, pretrained loading."""
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


def test_odd_input_size_gives_strided_maps():
    model = FLattenPVT('tiny').eval()
    with torch.no_grad():
        outs = model(torch.rand(1, 3, 333, 517))
    shapes = [tuple(o.shape) for o in outs]
    assert shapes == [(1, 64, 84, 130), (1, 128, 42, 65), (1, 320, 21, 33), (1, 512, 11, 17)]
    assert all(torch.isfinite(o).all() for o in outs)


def test_out_indices_and_bad_values():
    model = FLattenPVT('tiny', out_indices=(1, 3)).eval()
    with torch.no_grad():
        outs = model(torch.rand(1, 3, 64, 96))
    assert [o.shape[1] for o in outs] == [128, 512]
    with pytest.raises(ValueError, match='out_indices'):
        FLattenPVT('tiny', out_indices=(4, ))


def test_unknown_arch_lists_names_closest_first():
    with pytest.raises(KeyError) as err:
        FLattenPVT('tinny')
    msg = str(err.value)
    assert "'tinny'" in msg and msg.index('tiny') < msg.index('small')


def test_frozen_stages_really_frozen():
    model = FLattenPVT('tiny', frozen_stages=2)
    model.train()
    frozen = [model.patch_embed1, model.block1, model.patch_embed2, model.block2]
    for mod in frozen:
        assert not mod.training
        assert all(not p.requires_grad for p in mod.parameters())
    assert not model.pos_embed1.requires_grad and not model.pos_embed2.requires_grad
    assert model.block3.training and all(p.requires_grad for p in model.block3.parameters())
    # an optimiser step changes nothing in the frozen part
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    loss = sum(o.sum() for o in model(torch.rand(2, 3, 64, 64)))
    loss.backward()
    opt.step()
    after = model.state_dict()
    frozen_prefix = ('patch_embed1', 'block1', 'patch_embed2', 'block2', 'pos_embed1',
                     'pos_embed2')
    for k in before:
        if k.startswith(frozen_prefix):
            assert torch.equal(before[k], after[k]), k
    assert not torch.equal(before['block3.0.mlp.fc1.weight'], after['block3.0.mlp.fc1.weight'])


def test_frozen_stages_out_of_range():
    with pytest.raises(ValueError, match='frozen_stages'):
        FLattenPVT('tiny', frozen_stages=5)


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


def test_pretrained_missing_file_warns_and_trains_from_scratch(tmp_path):
    model = FLattenPVT('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'x')))
    model.init_weights()  # no exception
    assert model.pos_embed1.std() > 0  # random init happened


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


def test_pretrained_wrong_architecture_is_a_clear_error(tmp_path):
    sd = FLattenPVT(dict(embed_dims=[32, 64, 160, 256], num_heads=[1, 2, 5, 8],
                         mlp_ratios=[8, 8, 4, 4], depths=[2, 2, 2, 2])).state_dict()
    path = tmp_path / 'b0.pth'
    torch.save(sd, path)
    model = FLattenPVT('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match='does not fit'):
        model.init_weights()


def test_bf16_autocast_forward_backward_finite():
    model = FLattenPVT('tiny')
    x = torch.rand(1, 3, 96, 128)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(x)
    loss = sum(o.float().mean() for o in outs)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize('dtype', AMP_DTYPES)
def test_autocast_forward_backward_matches_fp32(dtype):
    # odd size; the focusing function and the attention sums run in fp32 inside, the LayerNorms
    # too (LayerNormFP32: torch's CPU LayerNorm sums its parameter gradients in bf16)
    torch.manual_seed(0)
    model = FLattenPVT('tiny', drop_path_rate=0.)  # both passes must run the same network
    model.init_weights()
    check_autocast_against_fp32(model, torch.rand(1, 3, 97, 131), dtype)
