"""FLatten-CSWin: official counts and layout, stripe padding, out-norms, checkpoints.

The contract every backbone keeps is ``test_backbone_contract.py``.
"""
import pytest
import torch
import torch.nn.functional as F

from mmeffvit.models import FLattenCSWin
from mmeffvit.models.backbones.flatten_cswin import LePEAttention

# official FLatten-CSWin counts (classification model: final norm and 1000-class head included)
OFFICIAL_PARAMS = {'tiny': 21_201_768, 'small': 35.45e6, 'base': 74.87e6, 'base_384': 78.37e6}
# a one-block-per-stage model for the tests that only need the plumbing
TINIEST = dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8])


def classification_params(model, classes=1000):
    """Parameters of the official classifier built from ``model``: no out-norms, + norm and head."""
    dims = model.embed_dims[-1]
    own = sum(p.numel() for n, p in model.named_parameters() if not n.startswith('norm'))
    return own + 2 * dims + dims * classes + classes


def test_tiny_parameter_count_and_layout_are_exactly_official():
    model = FLattenCSWin('tiny')
    assert classification_params(model) == OFFICIAL_PARAMS['tiny']
    sd = FLattenCSWin('tiny', out_norm=False).state_dict()
    assert len(sd) + 4 == 430  # official entry count with norm.{weight,bias}, head.{weight,bias}
    shapes = {
        'stage1_conv_embed.0.weight': (64, 3, 7, 7),
        'stage1_conv_embed.2.weight': (64, ),
        'merge1.conv.weight': (128, 64, 3, 3),
        'merge3.norm.bias': (512, ),
        'stage1.1.qkv.weight': (192, 64),
        'stage1.0.attns.0.positional_encoding': (1, 3136, 64),
        'stage2.3.attns.0.positional_encoding': (1, 784, 128),
        'stage2.0.attns.0.scale': (1, 1, 128),
        'stage1.0.attns.0.dwc.weight': (32, 1, 5, 5),
        'stage1.0.attns.0.get_v.weight': (64, 1, 3, 3),
        'stage3.17.attns.1.get_v.weight': (128, 1, 3, 3),
        'stage4.0.attns.0.get_v.weight': (512, 1, 3, 3),
        'stage4.0.mlp.fc2.weight': (512, 2048),
    }
    for key, shape in shapes.items():
        assert tuple(sd[key].shape) == shape, key
    assert 'stage3.0.attns.2.get_v.weight' not in sd and 'stage4.0.attns.1.get_v.weight' not in sd


@pytest.mark.parametrize('arch', ['small', 'base', 'base_384'])
def test_larger_parameter_counts(arch):
    total = classification_params(FLattenCSWin(arch, out_norm=False))
    assert abs(total / 1e6 - OFFICIAL_PARAMS[arch] / 1e6) < 0.005, total


def _reference_stripes(attn, q, k, v, hw):
    """Stripe-by-stripe attention on the unpadded map: the last stripe is simply narrower."""
    b, _, c = q.shape
    h, w = hw
    nh, d = attn.num_heads, c // attn.num_heads
    maps = [t.transpose(1, 2).reshape(b, c, h, w) for t in (q, k, v)]
    out = torch.zeros(b, c, h, w, dtype=q.dtype)
    s = attn.split_size
    if attn.idx == -1:
        windows = [(slice(0, h), slice(0, w))]
    elif attn.idx == 0:
        windows = [(slice(0, h), slice(x, min(x + s, w))) for x in range(0, w, s)]
    else:
        windows = [(slice(y, min(y + s, h)), slice(0, w)) for y in range(0, h, s)]
    for rows, cols in windows:
        qs, ks, vs = (m[:, :, rows, cols] for m in maps)
        wh, ww = qs.shape[-2:]
        lepe = F.conv2d(vs, attn.get_v.weight, attn.get_v.bias, padding=1, groups=c)
        for head in range(nh):
            ch = slice(head * d, (head + 1) * d)
            qh, kh, vh = (t[:, ch].flatten(2).transpose(1, 2) for t in (qs, ks, vs))
            scores = torch.einsum('bnd,bmd->bnm', qh, kh) * d ** -0.5
            oh = torch.einsum('bnm,bmd->bnd', scores.softmax(-1), vh)
            oh = oh.transpose(1, 2).reshape(b, d, wh, ww) + lepe[:, ch]
            out[:, ch, rows, cols] = oh
    return out.flatten(2).transpose(1, 2)


@pytest.mark.parametrize('idx', [0, 1, -1])
@pytest.mark.parametrize('hw', [(20, 23), (14, 14), (5, 9)])
def test_padded_stripes_match_unpadded_reference(idx, hw):
    """Padding to stripe multiples is invisible: masked keys, zero v, cropped outputs."""
    torch.manual_seed(0)
    attn = LePEAttention(32, 2, split_size=7, idx=idx).double()
    q, k, v = (torch.randn(2, hw[0] * hw[1], 32, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(attn(q, k, v, hw), _reference_stripes(attn, q, k, v, hw))


def test_every_parameter_gets_a_gradient_at_an_odd_size():
    model = FLattenCSWin(TINIEST)  # every kind of block: L, two-branch S, whole-map S
    loss = sum((o * torch.randn_like(o)).mean() for o in model(torch.rand(1, 3, 61, 75)))
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


def test_out_norms_follow_out_indices_and_bad_values():
    model = FLattenCSWin(TINIEST, out_indices=(1, 3))
    assert hasattr(model, 'norm1') and hasattr(model, 'norm3') and not hasattr(model, 'norm0')
    with pytest.raises(ValueError, match='attn_types'):
        FLattenCSWin('tiny', attn_types='LLXS')
    with pytest.raises(ValueError, match='split_sizes'):
        FLattenCSWin('tiny', split_sizes=(1, 2, 7))
    assert not any(n.startswith('norm') for n, _ in FLattenCSWin('tiny', out_norm=False)
                   .named_parameters())


def test_stage_types_and_branches():
    model = FLattenCSWin('tiny')
    assert type(model.stage1[0].attns[0]).__name__ == 'LePEFocusedLinearAttention'
    assert [a.idx for a in model.stage3[0].attns] == [0, 1]  # vertical, horizontal stripes
    assert [a.idx for a in model.stage4[0].attns] == [-1]  # whole map at any size
    assert model.stage2[0].attns[0].pe_size == (28, 28)
    big = FLattenCSWin('b384')
    assert big.stage1[0].attns[0].pe_size == (96, 96) and big.stage3[0].attns[0].split_size == 12


def _official_like_state_dict():
    """Official layout at 224²: no out-norms; final norm and head included."""
    ref = FLattenCSWin('tiny', out_norm=False)
    sd = {k: torch.randn_like(v) for k, v in ref.state_dict().items()}
    sd['norm.weight'], sd['norm.bias'] = torch.ones(512), torch.zeros(512)
    sd['head.weight'], sd['head.bias'] = torch.zeros(1000, 512), torch.zeros(1000)
    return sd


def test_official_checkpoint_loads_and_resizes(tmp_path):
    sd = _official_like_state_dict()
    path = tmp_path / 'flatten_cswin_t.pth'
    torch.save({'model': sd, 'epoch': 299}, path)
    # a different pre-training grid: positional encodings are resized bicubically
    model = FLattenCSWin('tiny', pretrain_img_size=256,
                         init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert model.stage1[0].attns[0].positional_encoding.shape == (1, 64 * 64, 64)
    assert model.stage2[3].attns[0].positional_encoding.shape == (1, 32 * 32, 128)
    torch.testing.assert_close(model.stage3[5].qkv.weight, sd['stage3.5.qkv.weight'])
    # same grid: every tensor bit-exact; only the out-norms are missing, head/norm dropped
    model = FLattenCSWin('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    result = model.load_state_dict(model.convert_weights(sd), strict=False)
    assert not result.unexpected_keys
    assert sorted(result.missing_keys) == sorted(
        f'norm{i}.{p}' for i in range(4) for p in ('weight', 'bias'))
    model.init_weights()
    torch.testing.assert_close(model.stage1[1].attns[0].positional_encoding,
                               sd['stage1.1.attns.0.positional_encoding'])
    torch.testing.assert_close(model.stage1_conv_embed[0].weight, sd['stage1_conv_embed.0.weight'])


def test_gradient_checkpointing_gives_the_same_result():
    torch.manual_seed(0)
    model = FLattenCSWin(TINIEST, drop_path_rate=0., out_indices=(3, ))
    x = torch.rand(1, 3, 48, 56)
    (ref, ) = model(x)
    ref.sum().backward()
    grad = model.stage2[0].qkv.weight.grad.clone()
    model.zero_grad()
    model.with_cp = True
    (out, ) = model(x)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(model.stage2[0].qkv.weight.grad, grad)


@pytest.mark.parametrize('idx', [0, 1, -1])
@pytest.mark.parametrize('hw', [(20, 23), (14, 14), (5, 9)])
def test_inference_stripes_on_onednn_attend_real_tokens_only(monkeypatch, switch_kernels, idx, hw):
    """CPU fp32 inference with oneDNN's linears (forced): stripes attend by oneDNN row blocks,
    the padded last stripe of each image on its real tokens (no mask, no flash kernel), equal to
    the unpadded stripe-by-stripe reference."""
    from torch.profiler import profile

    from mmeffvit.ops.policy import ONEDNN_LINEAR
    if not ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    switch_kernels(required=False, cpu_gemm='onednn')
    torch.manual_seed(0)
    attn = LePEAttention(32, 2, split_size=7, idx=idx)
    q, k, v = (torch.randn(2, hw[0] * hw[1], 32) for _ in range(3))
    with torch.no_grad(), profile() as prof:
        out = attn(q, k, v, hw)
    assert not any('scaled_dot_product' in e.key for e in prof.key_averages())
    ref = _reference_stripes(attn.double(), q.double(), k.double(), v.double(), hw)
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
