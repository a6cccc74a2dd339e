"""L²ViT: official counts, key layout, attention against naive forms, loading, mixed precision.

The contract every backbone keeps is ``test_backbone_contract.py``.
"""
import pytest
import torch
import torch.nn.functional as F

import mmeffvit  # noqa: F401
from mmeffvit.models import L2ViT
from mmeffvit.models.backbones.l2vit import LWABlock
from mmeffvit.models.layers import LayerNormFP32, clamped_linear_attention
from mmeffvit.analysis import analyze
from amp_check import AMP_DTYPES, check_autocast_against_fp32
from golden_care_l2vit import check_stages, fill, load_record, official_state_dict

# counts of the official classification model (l2vit.md sec. 3): params (M, 2 decimals),
# MACs at 224² (G, 2 decimals) and state_dict entries (BN buffers included)
OFFICIAL = {'tiny': (28.60, 4.71, 284), 'small': (50.20, 9.02, 536), 'base': (88.58, 15.86, 536)}


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def classification_params(model):
    """Ours minus the per-stage output norms, plus the official final LayerNorm and head."""
    c = model.embed_dims[-1]
    out_norms = sum(2 * d for d in model.embed_dims)
    return n_params(model) - out_norms + 2 * c + c * 1000 + 1000


@pytest.mark.parametrize('arch', list(OFFICIAL))
def test_parameter_counts_match_official(arch):
    with torch.device('meta'):
        model = L2ViT(arch)
    assert round(classification_params(model) / 1e6, 2) == OFFICIAL[arch][0]
    # official entries + out norms norm0..3 (8) - classifier norm/head (4)
    assert len(model.state_dict()) == OFFICIAL[arch][2] + 8 - 4


@pytest.mark.parametrize('arch', list(OFFICIAL))
def test_macs_match_official_with_and_without_compiled_ops(arch):
    """GMACs at 224² (what get_flops reports) against the official figures, which charge norms
    as mmengine's defaults do (``count_elementwise``). The linear-attention products (q·Σk, KᵀV,
    q·KV) must be counted whether the compiled operator or its reference runs."""
    model = L2ViT(arch)
    x = torch.rand(1, 3, 224, 224)
    reports = [analyze(model, x, count_elementwise=True, use_reference_ops=ref)
               for ref in (True, False)]
    for report in reports:
        assert not report.unsupported_ops
        assert abs(report.gmacs - OFFICIAL[arch][1]) < 0.01, report.by_operator
    assert reports[0].macs == reports[1].macs
    # the 3 products of one stage-4 LGA block alone (N = 49, C = 768 for tiny, d = 32)
    assert reports[0].by_operator['matmul'] > 3 * 49 * model.embed_dims[-1] * 32


def test_official_key_layout():
    sd = L2ViT('tiny').state_dict()
    expected = {
        'downsample_layers.0.proj.proj.0.weight': (48, 3, 3, 3),
        'downsample_layers.0.proj.proj.1.running_var': (48, ),
        'downsample_layers.0.proj.proj.3.weight': (96, 48, 3, 3),
        'downsample_layers.0.proj.proj.4.weight': (96, ),
        'downsample_layers.0.norm.weight': (96, ),
        'downsample_layers.1.norm.weight': (96, ),
        'downsample_layers.1.proj.weight': (192, 96, 2, 2),
        'stages.0.0.cpe.0.proj.weight': (96, 1, 3, 3),
        'stages.0.0.cpe.1.proj.bias': (96, ),
        'stages.0.0.attn.qkv.weight': (288, 96),
        'stages.0.0.mlp.fc1.weight': (384, 96),
        'stages.0.1.attn.temperature': (3, 1, 1),
        'stages.0.1.norm3.weight': (96, ),
        'stages.0.1.local_mp.conv1.weight': (96, 1, 7, 7),
        'stages.0.1.local_mp.bn.num_batches_tracked': (),
        'stages.0.1.local_mp.conv2.weight': (96, 1, 7, 7),
        'stages.3.1.mlp.fc2.weight': (768, 3072),
        'norm0.weight': (96, ),
        'norm3.bias': (768, ),
    }
    for key, shape in expected.items():
        assert tuple(sd[key].shape) == shape, key
    assert 'stages.0.0.cpe.1.proj.weight' in sd and 'stages.0.1.cpe.1.proj.weight' not in sd
    torch.testing.assert_close(sd['stages.2.1.attn.temperature'],
                               torch.full((12, 1, 1), 32**-0.5))


def naive_clamped_attention(q, k, v, temperature, floor):
    """The "qk-first" form with an explicit N×n attention matrix."""
    q, k = F.relu(q), F.relu(k)
    attn = q @ k.transpose(-2, -1)
    den = attn.sum(-1, keepdim=True).clamp(min=floor)
    return (attn @ v) * temperature / den


@pytest.mark.parametrize('ops_mode', ['reference', 'auto'])  # compiled when built
@pytest.mark.parametrize('scale', [0.1, 5.0])  # clamp active / inactive for most rows
def test_clamped_linear_attention_equals_naive_form(scale, ops_mode, switch_kernels):
    switch_kernels.reference() if ops_mode == 'reference' else switch_kernels(required=False)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, dtype=torch.float64) * scale for _ in range(3))
    temp = (torch.rand(3, 1, 1, dtype=torch.float64) + 0.2).requires_grad_()
    out = clamped_linear_attention(q, k, v, temp, 100.)
    ref = naive_clamped_attention(q, k, v, temp, 100.)
    torch.testing.assert_close(out, ref)
    weight = torch.randn_like(out)
    (grad, ) = torch.autograd.grad((out * weight).sum(), temp)
    torch.testing.assert_close(grad, torch.autograd.grad((ref * weight).sum(), temp)[0])
    den = F.relu(q) @ F.relu(k).sum(-2, keepdim=True).transpose(-2, -1)
    clamped = (den < 100).float().mean().item()
    assert (clamped > 0.9) if scale < 1 else (clamped < 0.5)


def test_clamped_linear_attention_is_fp32_under_autocast():
    q, k, v = (torch.randn(1, 2, 300, 16, dtype=torch.bfloat16) * 30 for _ in range(3))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = clamped_linear_attention(q, k, v, torch.ones(2, 1, 1))
    assert out.dtype == torch.float32
    ref = naive_clamped_attention(q.double(), k.double(), v.double(), 1., 100.)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def naive_window_block_attention(block, x, hw):
    """Window attention of an LWA block by an explicit loop over zero-padded windows."""
    h, w = hw
    ws = block.window_size
    c = x.shape[-1]
    shortcut = block.cpe[0](x, hw)
    y = block.norm1(shortcut).reshape(1, h, w, c)
    hp, wp = -(-h // ws) * ws, -(-w // ws) * ws
    padded = torch.zeros(1, hp, wp, c, dtype=x.dtype)
    padded[:, :h, :w] = y
    out = torch.zeros_like(padded)
    attn = block.attn
    d = c // attn.num_heads
    for i in range(0, hp, ws):
        for j in range(0, wp, ws):
            tok = padded[0, i:i + ws, j:j + ws].reshape(-1, c)
            q, k, v = attn.qkv(tok).split(c, dim=-1)
            heads = []
            for hd in range(attn.num_heads):
                sl = slice(hd * d, (hd + 1) * d)
                a = torch.softmax(q[:, sl] @ k[:, sl].T / d**0.5, dim=-1)
                heads.append(a @ v[:, sl])
            out[0, i:i + ws, j:j + ws] = attn.proj(torch.cat(heads, -1)).reshape(ws, ws, c)
    z = shortcut + out[:, :h, :w].reshape(1, h * w, c)
    z = block.cpe[1](z, hw)
    return z + block.mlp(block.norm2(z))


def test_window_block_equals_naive_loop_with_unmasked_padding():
    torch.manual_seed(0)
    block = LWABlock(16, 2, window_size=4).double().eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.3)
    hw = (5, 7)  # padded to 8 x 8: padded zero tokens act as keys (official, no mask)
    x = torch.randn(1, 35, 16, dtype=torch.float64)
    torch.testing.assert_close(block(x, hw), naive_window_block_attention(block, x, hw))


def test_out_norms_follow_out_indices_and_bad_arguments():
    model = L2ViT('tiny', out_indices=(1, 3))
    assert not hasattr(model, 'norm0') and hasattr(model, 'norm3')
    with pytest.raises(ValueError, match='window_size'):
        L2ViT('tiny', window_size=0)
    with pytest.raises(ValueError, match='divisible'):
        L2ViT(dict(embed_dims=[96, 192, 384, 768], depths=[2] * 4, num_heads=[5, 6, 12, 24]))


def _official_file(tmp_path):
    """An official release file: weights under 'model' (+ 'model_ema'), classifier included."""
    torch.manual_seed(0)
    sd = {k: torch.randn_like(v.float()).to(v.dtype)
          for k, v in L2ViT('tiny').state_dict().items() if not k.startswith('norm')}
    sd.update({'norm.weight': torch.ones(768), 'norm.bias': torch.zeros(768),
               'head.weight': torch.zeros(1000, 768), 'head.bias': torch.zeros(1000)})
    ema = {k: v + 1 for k, v in sd.items()}
    path = tmp_path / 'L2ViT-Tiny-checkpoint-best-ema.pth'
    torch.save({'model': sd, 'model_ema': ema, 'epoch': 299}, path)
    return path, sd


def test_official_checkpoint_loads_through_init_cfg(tmp_path):
    path, sd = _official_file(tmp_path)
    model = L2ViT('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    own = model.state_dict()
    for key, value in sd.items():
        if key.startswith(('norm.', 'head.')):
            assert key not in own
        else:
            assert torch.equal(own[key], value), key  # raw 'model' weights, not the EMA
    assert torch.equal(own['norm2.weight'], torch.ones(384))  # fresh out-norms


def test_random_init_follows_official_det_backbone():
    model = L2ViT('tiny')
    model.init_weights()
    conv = model.stages[0][1].local_mp.conv1  # kaiming fan_out (torch's fan: 96·49)
    assert abs(conv.weight.std().item() - (2 / (96 * 49))**0.5) < 0.003
    assert abs(model.stages[1][0].attn.qkv.weight.std().item() - 0.02) < 0.002
    assert torch.count_nonzero(model.stages[1][0].attn.qkv.bias) == 0


@pytest.mark.parametrize('dtype', AMP_DTYPES)
def test_autocast_forward_backward_matches_fp32(dtype):
    # odd size: padded windows and ceil strides; the clamped linear attention and every
    # LayerNorm run in fp32 inside
    model = L2ViT('tiny', drop_path_rate=0.)
    model.init_weights()
    check_autocast_against_fp32(model, torch.rand(1, 3, 97, 131), dtype)


def test_layernorm_fp32_keeps_parameter_gradients_accurate_under_autocast():
    # torch's CPU LayerNorm accumulates the weight/bias gradients over tokens in bf16 (66 %
    # off at 10^4 tokens); LayerNormFP32 (every LayerNorm of L2ViT and Focal) must not
    x = torch.randn(1, 10_000, 96)
    grad = torch.randn(1, 10_000, 96) + 0.3
    ref = LayerNormFP32(96)
    ref(x).backward(grad)
    for norm, expect_accurate in ((LayerNormFP32(96), True), (torch.nn.LayerNorm(96), False)):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = norm(x.bfloat16())
        assert out.dtype == (torch.float32 if expect_accurate else torch.bfloat16)
        out.backward(grad.to(out.dtype))
        err = (norm.bias.grad - ref.bias.grad).norm() / ref.bias.grad.norm()
        # the gradient fed in is rounded to bf16 once: a few 1e-3 at most
        assert (err < 1e-2) == expect_accurate, err
    with torch.no_grad():  # no autocast: exactly nn.LayerNorm
        assert torch.equal(ref(x), F.layer_norm(x, (96, ), ref.weight, ref.bias))


def _golden_model(record, tmp_path):
    kw = record['official_kwargs']
    arch = dict(embed_dims=list(kw['dims']), depths=list(kw['depths']),
                num_heads=list(kw['num_heads']))
    official = official_state_dict(record)
    path = tmp_path / 'official.pth'
    torch.save({'model': official, 'epoch': 1}, path)
    model = L2ViT(arch, drop_path_rate=kw.get('drop_path_rate', 0.),
                  init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert all(torch.equal(v, official[k]) for k, v in model.state_dict().items())
    return model.double().eval()


@pytest.mark.parametrize('name', ['l2vit_small_75x101',
                                  pytest.param('l2vit_tiny_199x263', marks=pytest.mark.slow)])
def test_golden_outputs_equal_official(name, tmp_path, request):
    """Odd sizes (padding in the stem, the downsampling and the windows) and both regimes of
    the clamped normaliser (0 % to 100 % of the rows clamped across the LGA blocks)."""
    record = load_record('l2vit', name)
    model = _golden_model(record, tmp_path)
    with torch.no_grad():
        outs = model(record['input'].double())
    check_stages(outs, record)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['l2vit_small_75x101', 'l2vit_tiny_199x263'])
def test_golden_outputs_on_the_triton_kernels(name, tmp_path):
    """The records in fp32 with the Triton kernels selected (the windows on
    ``mmeffvit::window_attention``, interpreted without a GPU), within fp32 tolerance."""
    from mmeffvit import ops
    from mmeffvit.analysis.kernel_count import KernelCounter
    pytest.importorskip('triton')
    record = load_record('l2vit', name)
    model = _golden_model(record, tmp_path).float()
    with torch.no_grad(), ops.use_kernels(required=False, triton=True), \
            KernelCounter() as counter:
        outs = model(record['input'].float())
    assert counter.count.by_op['mmeffvit.window_attention'] > 0
    for i, ours in enumerate(outs):
        ref = record['stages'][i] if record.get('stages') is not None else None
        got = ours.double() if ref is not None else ours.double().flatten()[::record['stride']]
        ref = ref if ref is not None else record['stage_samples'][i]
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4, msg=lambda m: f'stage {i}: {m}')


def test_golden_fill_rule_reproduces_stored_weights():
    record = load_record('l2vit', 'l2vit_small_75x101')
    for key, value in record['state_dict'].items():
        if not key.endswith('num_batches_tracked'):
            assert torch.equal(fill(key, value.shape), value), key


def test_blocks_get_contiguous_tokens():
    """The LayerNorm-before-conv downsampling hands the stage contiguous tokens: a conv's NCHW
    output viewed as tokens would make every norm and GEMM of the stage copy its input."""
    model = L2ViT(arch='tiny')
    seen = []
    for stage in model.stages:
        for block in stage:
            block.register_forward_pre_hook(lambda mod, args: seen.append(args[0].is_contiguous()))
    model(torch.randn(1, 3, 96, 128))
    assert len(seen) == sum(model.depths) and all(seen)
