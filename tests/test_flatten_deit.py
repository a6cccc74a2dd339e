"""FLatten-DeiT: analytic parameter counts, cls-token attention vs an explicit reference,
output types, block freezing, DeiT checkpoint loading.

The contract every backbone keeps (odd sizes, pyramid strides, names, loading) is
``test_backbone_contract.py``.
"""
import pytest
import timm
import torch
import torch.nn.functional as F

import mmeffvit  # noqa: F401
from mmeffvit.models import FLattenDeiT, FocusedLinearAttention
from mmeffvit.models.backbones.flatten_deit import ClsFocusedLinearAttention

# DeiT with its 1000-class head (timm deit_*_patch16_224; the paper's 5M / 22M / 86M)
DEIT_PARAMS = {'tiny': 5_717_416, 'small': 22_050_664, 'base': 86_567_656}
WIDTHS = {'tiny': (192, 3), 'small': (384, 6), 'base': (768, 12)}
FLA_PARAMS = ('attn.scale', 'attn.positional_encoding', 'attn.dwc.weight', 'attn.dwc.bias')


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def analytic_count(dims, heads, fla=True, head=True, depth=12, mlp=4, patch=16, grid=14,
                   kernel=5, classes=1000):
    """Parameters of (FLatten-)DeiT summed tensor by tensor from the architecture."""
    d = dims // heads
    total = dims * 3 * patch * patch + dims            # patch_embed.proj
    total += dims + (1 + grid * grid) * dims           # cls_token, pos_embed
    block = 2 * dims                                   # norm1
    block += 3 * dims * dims + 3 * dims                # attn.qkv
    block += dims * dims + dims                        # attn.proj
    block += 2 * dims                                  # norm2
    block += mlp * dims * dims + mlp * dims            # mlp.fc1
    block += mlp * dims * dims + dims                  # mlp.fc2
    if fla:
        block += dims                                  # attn.scale
        block += grid * grid * dims                    # attn.positional_encoding (patches only)
        block += d * kernel * kernel + d               # attn.dwc, shared by the heads
    total += depth * block + 2 * dims                  # blocks, norm
    if head:
        total += dims * classes + classes
    return total


@pytest.mark.parametrize('arch', ['tiny', 'small', 'base'])
def test_parameter_counts_are_analytic(arch):
    dims, heads = WIDTHS[arch]
    assert analytic_count(dims, heads, fla=False) == DEIT_PARAMS[arch]
    with torch.device('meta'):
        model = FLattenDeiT(arch)
    assert n_params(model) == analytic_count(dims, heads, head=False)
    extra = analytic_count(dims, heads) - DEIT_PARAMS[arch]
    assert extra == 12 * (dims + 196 * dims + (dims // heads) * 26)
    assert n_params(model) + dims * 1000 + 1000 == DEIT_PARAMS[arch] + extra


def test_tiny_count_and_pyramid_count():
    model = FLattenDeiT('tiny')
    assert n_params(model) + 192 * 1000 + 1000 == 6_191_272  # 5,717,416 + 473,856 FLA extras
    pyr = FLattenDeiT('tiny', out_type='featmap', with_pyramid=True)
    c, h, q = 192, 96, 48
    deconvs = (c * h * 4 + h) + 2 * h + (h * q * 4 + q) + (c * h * 4 + h)
    assert n_params(pyr) - n_params(model) == deconvs


def naive_cls_attention(attn, x, hw):
    """Prefix + grid focused linear attention written out with explicit N×n scores (float64)."""
    b, n, c = x.shape
    p = n - hw[0] * hw[1]
    h, d = attn.num_heads, attn.head_dims
    q, k, v = attn.qkv(x).chunk(3, -1)
    pe = attn.positional_encoding
    if tuple(hw) != attn.pe_size:
        grid = pe.reshape(1, *attn.pe_size, c).permute(0, 3, 1, 2)
        pe = F.interpolate(grid, size=hw, mode='bicubic', align_corners=False)
        pe = pe.permute(0, 2, 3, 1).reshape(1, -1, c)
    k = torch.cat([k[:, :p], k[:, p:] + pe], 1)
    if attn.cls_attention == 'query':
        k, v_keys = k[:, p:], v[:, p:]
    else:
        v_keys = v
    s = torch.log1p(torch.exp(attn.scale))

    def phi(t):
        t = (torch.clamp(t, min=0) + 1e-6) / s
        tp = t ** attn.focusing_factor
        return tp / tp.pow(2).sum(-1, keepdim=True).sqrt() * t.pow(2).sum(-1, keepdim=True).sqrt()

    qf, kf = phi(q), phi(k)
    out = torch.zeros_like(q)
    for i in range(h):
        sl = slice(i * d, (i + 1) * d)
        sim = qf[..., sl] @ kf[..., sl].transpose(-1, -2)
        out[..., sl] = (sim @ v_keys[..., sl]) / (sim.sum(-1, keepdim=True) + k.shape[1] * 1e-6)
    # DWC of the patch grid with kernel j for channel head*d + j, added to patch rows only
    vg = v[:, p:].transpose(1, 2).reshape(b, c, *hw)
    dwc = F.conv2d(vg, attn.dwc.weight.repeat(h, 1, 1, 1), attn.dwc.bias.repeat(h),
                   padding=attn.dwc.padding, groups=c)
    out[:, p:] = out[:, p:] + dwc.flatten(2).transpose(1, 2)
    return attn.proj(out)


def make_cls_attn(mode):
    torch.manual_seed(0)
    attn = ClsFocusedLinearAttention(12, 2, pe_size=(4, 5), cls_attention=mode, kernel_size=3)
    with torch.no_grad():
        attn.scale.normal_(0, 0.5)
        attn.positional_encoding.normal_(0, 0.5)
        attn.dwc.weight.normal_(0, 0.5)
    return attn.double()


@pytest.mark.parametrize('mode', ['full', 'query'])
@pytest.mark.parametrize('hw', [(4, 5), (3, 7)])
def test_cls_attention_matches_explicit_reference(mode, hw):
    attn = make_cls_attn(mode)
    x = torch.randn(2, 1 + hw[0] * hw[1], 12, dtype=torch.float64)
    torch.testing.assert_close(attn(x, hw), naive_cls_attention(attn, x, hw),
                               rtol=1e-9, atol=1e-9)


def test_query_mode_patches_equal_grid_only_attention():
    attn = make_cls_attn('query')
    grid_attn = FocusedLinearAttention(12, 2, pe_size=(4, 5), qkv_layout='qkv', kernel_size=3)
    grid_attn.load_state_dict(attn.state_dict())
    x = torch.randn(2, 21, 12, dtype=torch.float64)
    torch.testing.assert_close(attn(x, (4, 5))[:, 1:], grid_attn.double()(x[:, 1:], (4, 5)))


def test_out_types():
    x = torch.rand(2, 3, 64, 80)
    model = FLattenDeiT('tiny', out_indices=(1, -1)).eval()
    with torch.no_grad():
        first, last = model(x)
        model.out_type = 'raw'
        raw = model(x)[-1]
        model.out_type = 'avg_featmap'
        avg = model(x)[-1]
    assert first.shape == last.shape == (2, 192) and raw.shape == (2, 1 + 20, 192)
    torch.testing.assert_close(last, raw[:, 0])  # the cls token, after the final norm
    torch.testing.assert_close(avg, raw[:, 1:].mean(1))
    # final norm (weight 1, bias 0 at init) only on the last block's output
    torch.testing.assert_close(raw.mean(-1), torch.zeros(2, 21), atol=1e-4, rtol=0)


def test_blocks_after_the_last_output_do_not_run():
    model = FLattenDeiT('tiny', out_indices=(2, ), out_type='featmap')
    sum(o.sum() for o in model(torch.rand(1, 3, 32, 32))).backward()
    assert model.blocks[2].mlp.fc2.weight.grad is not None
    assert model.blocks[3].mlp.fc2.weight.grad is None


def test_bad_arguments():
    with pytest.raises(KeyError, match='out_type'):
        FLattenDeiT('tiny', out_type='featmaps')
    with pytest.raises(KeyError, match='cls_attention'):
        FLattenDeiT('tiny', cls_attention='none')
    with pytest.raises(ValueError, match='with_pyramid'):
        FLattenDeiT('tiny', out_indices=(5, 11), out_type='featmap', with_pyramid=True)
    with pytest.raises(ValueError, match='with_pyramid'):
        FLattenDeiT('tiny', with_pyramid=True)  # cls_token output


def test_frozen_stages_count_blocks_and_the_last_freezes_the_final_norm():
    model = FLattenDeiT('tiny', frozen_stages=4, out_type='featmap')
    assert not any(p.requires_grad for p in model.blocks[3].parameters())
    assert model.blocks[4].mlp.fc1.weight.requires_grad and model.norm.weight.requires_grad
    model = FLattenDeiT('tiny', frozen_stages=12)
    assert not model.norm.weight.requires_grad
    with pytest.raises(ValueError, match='frozen_stages'):
        FLattenDeiT('tiny', frozen_stages=13)


def test_deit_checkpoint_loads_all_but_fla_params(tmp_path):
    """A DeiT checkpoint in timm's layout (keys made by timm itself), head included."""
    deit = timm.create_model('deit_tiny_patch16_224', pretrained=False)
    sd = deit.state_dict()
    path = tmp_path / 'deit_tiny_patch16_224.pth'
    torch.save({'model': sd}, path)
    model = FLattenDeiT('tiny', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    result = model.load_state_dict(model.convert_weights(sd), strict=False)
    assert result.unexpected_keys == []
    assert result.missing_keys and all(k.endswith(FLA_PARAMS) for k in result.missing_keys)
    assert len(result.missing_keys) == 12 * len(FLA_PARAMS)
    model.init_weights()  # the same through init_cfg
    for key, value in sd.items():
        if not key.startswith('head.'):
            assert torch.equal(model.state_dict()[key], value), key


def test_distilled_checkpoint_and_resizing(tmp_path):
    """Distilled DeiT (dist token, 198 positions) into a model stored for 320² (20×20)."""
    sd = timm.create_model('deit_tiny_distilled_patch16_224', pretrained=False).state_dict()
    model = FLattenDeiT('tiny', pretrain_img_size=320)
    converted = model.convert_weights(sd)
    assert 'dist_token' not in converted and not any(k.startswith('head') for k in converted)
    assert converted['pos_embed'].shape == (1, 1 + 400, 192)
    torch.testing.assert_close(converted['pos_embed'][:, 0], sd['pos_embed'][:, 0])
    # FLatten-DeiT's own layout: positional encodings resized as well
    own = {k: torch.randn_like(v) for k, v in FLattenDeiT('tiny').state_dict().items()}
    path = tmp_path / 'flatten_deit_t.pth'
    torch.save({'model': own}, path)
    model = FLattenDeiT('tiny', pretrain_img_size=320,
                        init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert model.blocks[0].attn.positional_encoding.shape == (1, 400, 192)
    torch.testing.assert_close(model.blocks[5].attn.qkv.weight, own['blocks.5.attn.qkv.weight'])
