"""FLatten-Swin: official parameter counts and features, window attention, small sizes, loading.

The contract every backbone keeps is ``test_backbone_contract.py``.
"""
import math
import os.path as osp
import zlib

import pytest
import torch
import torch.nn.functional as F

from mmeffvit.models import FLattenSwin
from mmeffvit.models.backbones.flatten_swin import FLattenSwinBlock
from mmeffvit.models.layers.relative_position import resize_bias_table, shifted_window_mask

GOLDEN = osp.join(osp.dirname(osp.abspath(__file__)), 'data', 'golden', 'flatten',
                  'swin_small_384_window12.pt')

# official counts (classification model: parameters incl. final norm and 1000-class head)
OFFICIAL_PARAMS = {
    ('tiny', 224): 29_192_384,
    ('small', 224): 50_510_288,
    ('base', 224): 88_972_488,
    ('base', 384): 91_433_928,
}

# small official-layout models whose features were computed with the official code
# (tests/data/golden/README.md says how); official_window is its WINDOW_SIZE setting. The 224²
# window-7 layout is covered by test_golden_flatten.py; this is the 384² fine-tuning layout
# (FLA grids 96/48, S window 12, stage 4 a single 12×12 window)
_SMALL = dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])
GOLDEN_CASES = {
    'w12_384': dict(_SMALL, img=384, official_window=96, window=12),
}


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def official_weights(shapes):
    """Deterministic weights by parameter name (same name, same values in any model).

    Every official parameter gets non-trivial values, the zero-initialised ``scale``,
    ``positional_encoding`` and ``relative_position_bias_table`` included. Buffers are skipped.
    """
    out = {}
    for key, shape in shapes.items():
        if key.endswith(('relative_position_index', 'attn_mask')):
            continue
        gen = torch.Generator().manual_seed(zlib.crc32(key.encode()))
        value = torch.randn(tuple(shape), generator=gen)
        if key.endswith(('scale', 'positional_encoding', 'relative_position_bias_table')):
            value = value * 0.5
        elif len(shape) == 1 and 'norm' in key and key.endswith('weight'):
            value = 1 + 0.1 * value
        elif len(shape) >= 2:
            value = value * math.prod(shape[1:]) ** -0.5
        else:
            value = value * 0.1
        out[key] = value
    return out


def golden_input(case):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(1, 3, case['img'], case['img'], generator=gen)


def stored_tokens(tokens):
    """What the golden file keeps of ``(B, N, C)`` stage tokens: image 0, about 4096 values."""
    n, c = tokens.shape[1:]
    return tokens[0, ::max(1, math.ceil(n * c / 4096))]


def official_layout_state_dict(model, img, classes=1000):
    """State dict with the official keys: ours minus ``norm{i}``, plus norm, head, attn_mask."""
    shapes = {k: v.shape for k, v in model.state_dict().items()
              if not k.startswith(tuple(f'norm{i}.' for i in range(4)))}
    sd = official_weights(shapes)
    for k, v in model.state_dict().items():
        if k.endswith('relative_position_index'):
            sd[k] = v.clone()
    c = model.embed_dims[-1]
    sd.update(official_weights({'norm.weight': (c, ), 'norm.bias': (c, ),
                                'head.weight': (classes, c), 'head.bias': (classes, )}))
    # the official shifted blocks carry a fixed mask buffer (stage map larger than the window)
    side = img // 4
    for i, layer in enumerate(model.layers):
        for j, blk in enumerate(layer.blocks):
            w = blk.window_size
            if blk.attn_type == 'S' and j % 2 and side > w:
                sd[f'layers.{i}.blocks.{j}.attn_mask'] = shifted_window_mask(side, side, w, w // 2)
        side //= 2
    return sd


# -- architecture --------------------------------------------------------------------------------
@pytest.mark.parametrize('arch,img', list(OFFICIAL_PARAMS))
def test_parameter_count_is_exactly_official(arch, img):
    model = FLattenSwin(arch, pretrain_img_size=img, window_size=12 if img == 384 else 7)
    c = model.embed_dims[-1]
    out_norms = sum(n_params(getattr(model, f'norm{i}')) for i in model.out_indices)
    # the official model adds its final LayerNorm(8C) and head Linear(8C, 1000), and has no
    # per-output norms
    total = n_params(model) - out_norms + 2 * c + c * 1000 + 1000
    assert total == OFFICIAL_PARAMS[(arch, img)]


def test_official_names_and_shapes():
    sd = FLattenSwin('tiny').state_dict()
    assert sd['patch_embed.proj.weight'].shape == (96, 3, 4, 4)
    assert sd['layers.0.blocks.1.attn.positional_encoding'].shape == (1, 3136, 96)
    assert sd['layers.1.blocks.0.attn.positional_encoding'].shape == (1, 784, 192)
    assert sd['layers.1.blocks.0.attn.scale'].shape == (1, 1, 192)
    assert sd['layers.0.blocks.0.attn.dwc.weight'].shape == (32, 1, 5, 5)
    assert sd['layers.0.blocks.0.attn.qkv.weight'].shape == (288, 96)
    assert sd['layers.2.blocks.5.attn.relative_position_bias_table'].shape == (169, 12)
    assert sd['layers.3.blocks.1.attn.relative_position_index'].shape == (49, 49)
    assert sd['layers.2.downsample.reduction.weight'].shape == (768, 1536)
    assert sd['layers.2.downsample.norm.weight'].shape == (1536, )
    assert 'layers.3.downsample.norm.weight' not in sd and 'head.weight' not in sd
    assert not any('relative_position' in k for k in sd if k.startswith('layers.0'))
    # the official Swin-T has 196 entries: minus norm/head (4) and 3 attn_mask, plus 4 out-norms
    assert len(sd) == 196 - 4 - 3 + 8
    b384 = FLattenSwin('base', pretrain_img_size=384, window_size=12).state_dict()
    assert b384['layers.0.blocks.0.attn.positional_encoding'].shape == (1, 9216, 128)
    assert b384['layers.1.blocks.0.attn.positional_encoding'].shape == (1, 2304, 256)
    assert b384['layers.2.blocks.0.attn.relative_position_bias_table'].shape == (529, 16)


@pytest.mark.parametrize('name', list(GOLDEN_CASES))
def test_features_match_official_code(tmp_path, name):
    """Official checkpoint layout → our model → the official model's stage features."""
    case = GOLDEN_CASES[name]
    arch = {k: case[k] for k in ('embed_dims', 'depths', 'num_heads')}
    ref = FLattenSwin(arch, pretrain_img_size=case['img'], window_size=case['window'])
    path = tmp_path / 'official.pth'
    torch.save({'model': official_layout_state_dict(ref, case['img']), 'epoch': 299}, path)
    # the official code decides windows at construction: stage 4 (12x12) is unshifted
    model = FLattenSwin(arch, pretrain_img_size=case['img'], window_size=case['window'],
                        official_window_rule=True, drop_path_rate=0.,
                        init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    model.eval()
    feats = {}
    for i, layer in enumerate(model.layers):
        layer.blocks[-1].register_forward_hook(lambda m, a, o, i=i: feats.__setitem__(i, o))
    with torch.no_grad():
        model(golden_input(case))
    golden = torch.load(GOLDEN, weights_only=True)[name]
    for i in range(4):
        torch.testing.assert_close(stored_tokens(feats[i]), golden[i], rtol=1e-4, atol=1e-4)
    # mmdet's rule (default) keeps shifting the 12x12 map: stages 1-3 equal, stage 4 differs
    model.layers[3].blocks[1].official_window_rule = False
    with torch.no_grad():
        model(golden_input(case))
    torch.testing.assert_close(stored_tokens(feats[2]), golden[2], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(stored_tokens(feats[3]), golden[3], atol=1e-3)


# -- shifted-window attention against a dense reference ------------------------------------------
def dense_window_block_reference(blk, x, hw):
    """An S block computed over the whole padded map with an explicit N×N mask (float64).

    No window partition and no roll: each token's position in the shifted frame decides its
    window (pairs in different windows are excluded), its strip label (the -100 mask) and the
    relative offsets that index the bias table.
    """
    attn = blk.attn
    b, n, c = x.shape
    height, width = hw
    w, s = blk.window_and_shift(hw)
    big = attn.window_size
    hp, wp = math.ceil(height / w) * w, math.ceil(width / w) * w
    y = F.pad(blk.norm1(x).view(b, height, width, c), (0, 0, 0, wp - width, 0, hp - height))
    y = y.reshape(b, hp * wp, c)
    heads, d = attn.num_heads, c // attn.num_heads
    q, k, v = attn.qkv(y).view(b, hp * wp, 3, heads, d).permute(2, 0, 3, 1, 4)
    rows = (torch.arange(hp * wp) // wp - s) % hp  # position after rolling by -s
    cols = (torch.arange(hp * wp) % wp - s) % wp

    def strip(pos, size):
        return (pos >= size - w).long() + (pos >= size - s).long() if s else torch.zeros_like(pos)

    window_id = (rows // w) * (wp // w) + cols // w
    region = strip(rows, hp) * 3 + strip(cols, wp)
    rel = ((rows[:, None] - rows[None]) + big - 1) * (2 * big - 1) + (cols[:, None] - cols[None])
    rel = (rel + big - 1).clamp(0, (2 * big - 1) ** 2 - 1)  # clamped entries are masked anyway
    logits = q @ k.transpose(-2, -1) / math.sqrt(d)
    logits = logits + attn.relative_position_bias_table[rel].permute(2, 0, 1)
    logits = logits + (region[:, None] != region[None]) * -100.0
    logits = logits.masked_fill(window_id[:, None] != window_id[None], float('-inf'))
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(b, hp, wp, c)
    out = attn.proj(out[:, :height, :width].reshape(b, n, c))
    x = x + out
    return x + blk.mlp(blk.norm2(x))


@pytest.mark.parametrize('hw,shift,rule', [
    ((9, 13), 2, False),   # padded to 12x16, shifted, masks for the padded size
    ((8, 8), 2, False),    # exact multiple
    ((3, 5), 2, False),    # map smaller than the window: padded, still shifted (mmdet)
    ((3, 5), 2, True),     # official rule: one 3x3 window, no shift, central bias entries
    ((7, 11), 0, False),   # unshifted
])
def test_window_block_matches_dense_reference(hw, shift, rule):
    torch.manual_seed(0)
    blk = FLattenSwinBlock(16, 2, attn_type='S', window_size=4, shift_size=shift,
                           official_window_rule=rule).double().eval()
    with torch.no_grad():
        blk.attn.relative_position_bias_table.normal_(0, 1)
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64)
    torch.testing.assert_close(blk(x, hw), dense_window_block_reference(blk, x, hw),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
@pytest.mark.parametrize('hw,qkv_bias', [((9, 13), True), ((9, 13), False), ((8, 12), True)])
def test_window_block_gradients_match_dense_reference(hw, qkv_bias, dtype):
    """Training: a padded map projects only its H×W tokens (the padding's qkv is the bias) and
    projects after the crop; values and gradients equal those of the dense padded reference."""
    torch.manual_seed(0)
    blk = FLattenSwinBlock(16, 2, attn_type='S', window_size=4, shift_size=2,
                           qkv_bias=qkv_bias).to(dtype).train()
    with torch.no_grad():
        blk.attn.relative_position_bias_table.normal_(0, 1)
        if qkv_bias:
            blk.attn.qkv.bias.normal_(0, 1)
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=dtype, requires_grad=True)
    params = [x] + list(blk.parameters())
    grad_out = torch.randn(2, hw[0] * hw[1], 16, dtype=dtype)
    got = torch.autograd.grad(blk(x, hw), params, grad_out)
    want = torch.autograd.grad(dense_window_block_reference(blk, x, hw), params, grad_out)
    tol = dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    for name, g, w in zip(['x'] + [n for n, _ in blk.named_parameters()], got, want):
        torch.testing.assert_close(g, w, msg=name, **tol)


def test_hooked_window_attention_is_called_as_a_module_with_the_same_output():
    """A hook on ``attn`` (the attention-map tools) sees the module's own call on the padded
    windows; the output equals the unhooked path that projects only the real tokens."""
    torch.manual_seed(0)
    blk = FLattenSwinBlock(16, 2, attn_type='S', window_size=4, shift_size=2).eval()
    x, hw = torch.randn(2, 9 * 13, 16), (9, 13)
    seen = []
    with torch.no_grad():
        plain = blk(x, hw)
        handle = blk.attn.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape))
        hooked = blk(x, hw)
        handle.remove()
    assert seen == [(2 * 3 * 4, 16, 16)]  # the 12×16 padded map: 3×4 windows per image
    torch.testing.assert_close(hooked, plain, rtol=1e-5, atol=1e-6)


# -- dense-prediction behaviour ------------------------------------------------------------------
def small(**kwargs):
    return FLattenSwin(dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4]),
                       **kwargs)


@pytest.mark.parametrize('size', [(32, 32), (45, 61), (29, 200)])
def test_small_and_elongated_inputs(size):
    model = small().eval()
    with torch.no_grad():
        outs = model(torch.rand(2, 3, *size))
    h, w = math.ceil(size[0] / 4), math.ceil(size[1] / 4)
    for i, o in enumerate(outs):
        assert o.shape == (2, 16 * 2 ** i, h, w)
        assert torch.isfinite(o).all()
        h, w = math.ceil(h / 2), math.ceil(w / 2)


def test_batch_items_are_independent():
    model = small().eval()
    x = torch.rand(3, 3, 50, 70)
    with torch.no_grad():
        together = model(x)
        alone = model(x[1:2])
    for a, b in zip(together, alone):
        torch.testing.assert_close(a[1:2], b, rtol=1e-4, atol=1e-5)


def test_out_norms_follow_out_indices_and_bad_arguments():
    model = small(out_indices=(1, 3))
    assert hasattr(model, 'norm1') and hasattr(model, 'norm3') and not hasattr(model, 'norm0')
    with pytest.raises(ValueError, match='attn_type'):
        small(attn_type='LLS')
    with pytest.raises(ValueError, match='attn_type'):
        small(attn_type='LLXS')
    with pytest.raises(ValueError, match='window_size'):
        small(window_size=0)
    with pytest.raises(ValueError, match='divisible'):
        FLattenSwin(dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[3, 2, 2, 4]))


def test_other_attention_layouts():
    # all-window (plain Swin) and all-linear variants build and run at any size
    for attn_type in ('SSSS', 'LLLL'):
        model = small(attn_type=attn_type).eval()
        with torch.no_grad():
            outs = model(torch.rand(1, 3, 70, 90))
        assert outs[-1].shape == (1, 128, 3, 3)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = small(drop_path_rate=0.)
    plain.init_weights()
    ckpt = small(drop_path_rate=0., with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.rand(1, 3, 40, 56)
    for model in (plain, ckpt):
        model.train()
        sum(o.square().mean() for o in model(x)).backward()
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_random_init_fills_bias_tables_and_keeps_fla_zero_init():
    model = small()
    model.init_weights()
    assert model.layers[2].blocks[0].attn.relative_position_bias_table.std() > 0.01
    assert model.layers[0].blocks[0].attn.positional_encoding.abs().sum() == 0


def test_pretrained_384_checkpoint_into_224_model(tmp_path):
    arch = dict(_SMALL)
    src = FLattenSwin(arch, pretrain_img_size=384, window_size=12)
    sd = official_layout_state_dict(src, 384)
    path = tmp_path / 'flatten_swin_b_384.pth'
    torch.save({'model': sd}, path)
    model = FLattenSwin(arch, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    converted = model.convert_weights(dict(sd))
    # dropped: classifier, final norm, fixed masks; absent: only the out-norms
    assert not any(k.startswith(('head.', 'norm.')) or k.endswith('attn_mask') for k in converted)
    assert set(model.state_dict()) - set(converted) == {
        f'norm{i}.{p}' for i in range(4) for p in ('weight', 'bias')}
    model.init_weights()
    pe = model.layers[0].blocks[1].attn.positional_encoding
    assert pe.shape == (1, 56 * 56, 16)
    src_pe = sd['layers.0.blocks.1.attn.positional_encoding']
    expected = F.interpolate(src_pe.transpose(1, 2).reshape(1, 16, 96, 96), size=(56, 56),
                             mode='bicubic', align_corners=False)
    torch.testing.assert_close(pe, expected.flatten(2).transpose(1, 2))
    table = model.layers[2].blocks[1].attn.relative_position_bias_table
    assert table.shape == (169, 4)
    torch.testing.assert_close(
        table, resize_bias_table(sd['layers.2.blocks.1.attn.relative_position_bias_table'], 169))
    idx = model.layers[2].blocks[1].attn.relative_position_index
    assert idx.shape == (49, 49) and idx.max() == 168
    torch.testing.assert_close(model.layers[3].blocks[0].mlp.fc2.weight,
                               sd['layers.3.blocks.0.mlp.fc2.weight'])


def test_resize_bias_table_keeps_a_constant_table_and_the_centre():
    table = torch.full((169, 3), 0.7)
    torch.testing.assert_close(resize_bias_table(table, 529), torch.full((529, 3), 0.7))
    ramp = torch.arange(13.).repeat(13)[:, None]  # linear in dx: bicubic keeps the zero offset
    assert resize_bias_table(ramp, 529).reshape(23, 23)[11, 11] == pytest.approx(6.0, abs=1e-4)


@pytest.mark.parametrize('bias_windows', [1, 6])
@pytest.mark.parametrize('with_mask', [False, True])
def test_biased_attention_matches_explicit_softmax_with_gradients(with_mask, bias_windows):
    # the recomputing backward (bias that needs a gradient, CPU) against autograd through an
    # explicit softmax, in float64: output and the gradients of q, k, v and the bias (shared by
    # the windows or one per window); keys as a transposed view, as Focal's gathered keys
    from mmeffvit.ops.biased_attention import biased_attention
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(6, 2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k2 = torch.randn(6, 7, 2, 4, generator=gen, dtype=torch.float64).requires_grad_()
    v2 = torch.randn(6, 2, 7, 3, generator=gen, dtype=torch.float64).requires_grad_()
    bias = torch.randn(bias_windows, 2, 5, 7, generator=gen, dtype=torch.float64,
                       requires_grad=True)
    bias_before = bias.detach().clone()
    mask = None
    if with_mask:
        mask = torch.zeros(6, 1, 1, 7, dtype=torch.float64)
        mask[::2, ..., -2:] = float('-inf')
    grad = torch.randn(6, 2, 5, 3, generator=gen, dtype=torch.float64)
    out = biased_attention(q, k2.transpose(1, 2), v2, bias, mask, scale=0.3)
    assert out.grad_fn is not None and 'Recomputed' in type(out.grad_fn).__name__
    got = torch.autograd.grad(out, (q, k2, v2, bias), grad)
    scores = q @ k2.permute(0, 2, 3, 1) * 0.3 + bias + (0 if mask is None else mask)
    ref = scores.softmax(-1) @ v2
    want = torch.autograd.grad(ref, (q, k2, v2, bias), grad)
    torch.testing.assert_close(out, ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert torch.equal(bias.detach(), bias_before)  # the backward works on its own buffers


@pytest.mark.parametrize('with_mask', [False, True])
def test_biased_attention_forward_runs_the_fused_kernel_with_a_trained_bias(with_mask):
    # a mask that requires a gradient sends torch's dispatch to its composite kernel (which
    # stores the probabilities' softmax over a fresh scores map); the bias is this function's
    # own to differentiate, so the forward passes it detached
    from mmeffvit.ops.biased_attention import biased_attention
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(8, 3, 49, 16, generator=gen, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 3, 49, 49, generator=gen, requires_grad=True)
    mask = torch.zeros(8, 1, 49, 49) if with_mask else None
    with torch.profiler.profile() as prof:
        out = biased_attention(q, k, v, bias, mask, scale=0.25)
    names = {event.name for event in prof.events()}
    assert 'aten::_scaled_dot_product_flash_attention_for_cpu' in names
    assert 'aten::_scaled_dot_product_attention_math' not in names
    assert out.grad_fn is not None and 'Recomputed' in type(out.grad_fn).__name__
