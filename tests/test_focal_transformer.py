"""Focal Transformer: official counts and features, border masking, small sizes, loading.

The contract every backbone keeps is ``test_backbone_contract.py``.
"""
import math
import os.path as osp

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mmeffvit.models import FocalTransformer
from mmeffvit.models.layers import pad_to_windows, window_partition, window_reverse
from mmeffvit.models.backbones.focal_transformer import (FocalTransformerBlock, ring_slots,
                                                         pooled_relative_index)
from amp_check import AMP_DTYPES, check_autocast_against_fp32

GOLDEN = osp.join(osp.dirname(osp.abspath(__file__)), 'data', 'golden', 'focal',
                  'focal_official.pt')

# parameters of the official classification model (incl. final norm and 1000-class head),
# counted on microsoft/Focal-Transformer built with the released YAML settings at 224²
OFFICIAL_PARAMS = {
    ('tiny', False): 28_880_380, ('small', False): 51_141_940, ('base', False): 89_815_400,
    ('tiny', True): 30_825_244, ('small', True): 53_086_804, ('base', True): 93_268_712,
}
# published GMACs at 224² (README table; the official flops() gives 4.92 / 9.43 / 16.37 /
# 5.17). Ours count the 132 rolled keys actually attended where the official formula counts the
# 120-token ring, hence ~0.6 % more.
PUBLISHED_GMACS = {('tiny', False): 4.9, ('small', False): 9.4, ('base', False): 16.4,
                   ('tiny', True): 5.2}
SMALL = dict(embed_dims=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4])


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def small(**kwargs):
    kwargs.setdefault('drop_path_rate', 0.)
    return FocalTransformer(dict(SMALL), **kwargs)


def randomise(model, seed=0):
    """Non-zero values everywhere (the window table starts at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.5 if 'relative_position' in name else p[0].numel() ** -0.5 if p.dim() > 1 \
                else 0.05
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale
                    + (1. if name.endswith(('norm1.weight', 'norm2.weight')) else 0.))
    return model


# -- architecture --------------------------------------------------------------------------------
@pytest.mark.parametrize('arch,conv', list(OFFICIAL_PARAMS))
def test_parameter_count_is_exactly_official(arch, conv):
    # the 224² structure: stage 4 (7x7) has no surroundings table
    model = FocalTransformer(arch, use_conv_embed=conv, expand_sizes=(3, 3, 3, 0))
    c = model.embed_dims[-1]
    outs = sum(n_params(getattr(model, f'norm{i}')) for i in model.out_indices)
    assert n_params(model) - outs + 2 * c + 1000 * c + 1000 == OFFICIAL_PARAMS[(arch, conv)]


def macs(module, *args):
    # torch's counter has no formula for the fused CPU attention kernel: count its math form
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), \
            FlopCounterMode(display=False) as counter:
        module(*args)
    return counter.get_total_flops() / 2


@pytest.mark.parametrize('arch,conv', list(PUBLISHED_GMACS))
def test_gmacs_match_published(arch, conv):
    # stage 3 holds 6 or 18 identical blocks: count a model with one of them and add the others
    # (each measured alone on the 14x14 map), which keeps the test fast
    settings = dict(FocalTransformer.arch_settings[arch])
    depth3 = settings['depths'][2]
    settings['depths'] = [2, 2, 1, 2]
    model = FocalTransformer(settings, use_conv_embed=conv, expand_sizes=(3, 3, 3, 0)).eval()
    total = macs(model, torch.rand(1, 3, 224, 224))
    blk, c = model.layers[2].blocks[0], model.embed_dims[2]
    total += (depth3 - 1) * macs(blk, torch.rand(1, 196, c), (14, 14))
    gmacs = (total + model.embed_dims[-1] * 1000) / 1e9  # + the classifier of the count
    assert gmacs == pytest.approx(PUBLISHED_GMACS[(arch, conv)], rel=0.012)


def test_dense_model_adds_stage4_neighbour_tables():
    # the default dense-prediction model adds stage 4's (1, h, 49, 132) table per block
    dense, official = small(), small(expand_sizes=(3, 3, 3, 0))
    assert n_params(dense) - n_params(official) == 1 * 4 * 49 * 132


def test_official_names_and_shapes():
    sd = FocalTransformer('tiny', expand_sizes=(3, 3, 3, 0)).state_dict()
    assert sd['patch_embed.proj.weight'].shape == (96, 3, 4, 4)
    assert sd['layers.0.blocks.0.pool_layers.0.weight'].shape == (1, 49)
    assert sd['layers.0.blocks.0.attn.relative_position_bias_table'].shape == (169, 3)
    assert sd['layers.0.blocks.0.attn.relative_position_bias_table_to_neighbors'].shape == (
        1, 3, 49, 132)
    assert sd['layers.0.blocks.0.attn.valid_ind_rolled'].shape == (132, )
    for i, (h, n) in enumerate([(3, 169), (6, 121), (12, 81), (24, 49)]):
        assert sd[f'layers.{i}.blocks.0.attn.relative_position_bias_table_to_windows.0'].shape \
            == (h, n)
        assert sd[f'layers.{i}.blocks.0.attn.relative_position_index_0'].shape == (
            49, [49, 25, 9, 1][i])
    assert 'layers.3.blocks.0.attn.relative_position_bias_table_to_neighbors' not in sd
    assert sd['layers.2.downsample.proj.weight'].shape == (768, 384, 2, 2)
    assert 'layers.3.downsample.proj.weight' not in sd
    # official Focal-T: 256 entries; minus norm/head (4), plus 4 out-norms (8)
    assert len(sd) == 256 - 4 + 8
    conv = FocalTransformer('tiny', use_conv_embed=True).state_dict()
    assert conv['patch_embed.proj.weight'].shape == (96, 3, 7, 7)
    assert conv['layers.0.downsample.proj.weight'].shape == (192, 96, 3, 3)


def test_ring_slots_are_the_ring_plus_twelve_duplicates():
    slots = ring_slots(7, 3)
    assert len(slots) == 132
    keys = {(int(r + dy), int(c + dx)) for r, c, dy, dx in slots}
    ring = {(r, c) for r in range(-3, 10) for c in range(-3, 10)
            if not (0 <= r < 7 and 0 <= c < 7)}
    assert keys == ring  # every ring token, nothing of the window itself
    idx = pooled_relative_index(7, 3)
    assert idx.shape == (49, 9) and idx.max() == 80 and idx.min() == 0


# -- the official implementation -----------------------------------------------------------------
@pytest.mark.parametrize('name', ['linear_224', 'conv_256x320', 'levels3_224x288'])
def test_features_match_official_code(name):
    """Weights of an official model → our model (official borders) → its stage features."""
    rec = torch.load(GOLDEN, weights_only=True)[name]
    kw = rec['official_kwargs']
    img = tuple(kw['img_size'])
    # the official model turns the surroundings off where the stage map is <= the window
    expand = tuple(0 if min(s // 4 // 2 ** i for s in img) <= 7 else 3 for i in range(4))
    model = FocalTransformer(
        dict(embed_dims=kw['embed_dim'], depths=kw['depths'], num_heads=kw['num_heads']),
        use_conv_embed=kw['use_conv_embed'], expand_sizes=expand,
        focal_levels=kw['focal_levels'], focal_windows=kw['focal_windows'],
        mask_borders=False, drop_path_rate=0.)
    result = model.load_state_dict(model.convert_weights(dict(rec['state_dict'])), strict=False)
    assert sorted(result.missing_keys) == sorted(f'norm{i}.{p}' for i in range(4)
                                                 for p in ('weight', 'bias'))
    assert result.unexpected_keys == []
    model = model.double().eval()
    feats = {}
    for i, layer in enumerate(model.layers):
        layer.blocks[-1].register_forward_hook(lambda m, a, o, i=i: feats.__setitem__(i, o))
    x = torch.randn(1, 3, *img, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        model(x)
    for i in range(4):
        n, c = feats[i].shape[1:]
        ours = feats[i][0, ::max(1, math.ceil(n * c / 4096))]
        torch.testing.assert_close(ours, rec['features'][i], rtol=1e-9, atol=1e-9)


# -- borders -------------------------------------------------------------------------------------
def block(mask_borders, **kwargs):
    torch.manual_seed(0)
    blk = FocalTransformerBlock(16, 2, window_size=7, expand_size=3, focal_level=2,
                                focal_window=3, mask_borders=mask_borders, **kwargs)
    return randomise(blk).double().eval()


def test_masking_ignores_content_beyond_the_opposite_border():
    # 35x35 map = 5x5 windows: the top-left window reaches rows/cols < 10 directly and, through
    # the official wrap-around, the last 3 rows/cols
    hw = (35, 35)
    x = torch.randn(1, 35, 35, 16, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 30:] += torch.randn_like(x2[:, 30:])
    x2[:, :, 30:] += torch.randn_like(x2[:, :, 30:])
    for mask, changes in ((True, False), (False, True)):
        blk = block(mask)
        with torch.no_grad():
            a = blk(x.reshape(1, -1, 16), hw).view(1, 35, 35, 16)
            b = blk(x2.reshape(1, -1, 16), hw).view(1, 35, 35, 16)
        diff = (a[:, :7, :7] - b[:, :7, :7]).abs().max()
        assert (diff > 1e-3) == changes, (mask, diff)


def test_masking_ignores_padding_and_interior_windows_equal_official():
    # 30x33 is padded to 35x35: the padded rows/cols get values in the official code (qkv
    # bias), which masking must exclude; interior windows see no border and agree
    blk_mask, blk_off = block(True), block(False)
    blk_off.load_state_dict(blk_mask.state_dict())
    x = torch.randn(2, 35 * 35, 16, dtype=torch.float64)
    with torch.no_grad():
        a = blk_mask(x, (35, 35)).view(2, 35, 35, 16)
        b = blk_off(x, (35, 35)).view(2, 35, 35, 16)
    torch.testing.assert_close(a[:, 7:28, 7:28], b[:, 7:28, 7:28], rtol=1e-12, atol=1e-12)
    assert (a[:, :7] - b[:, :7]).abs().max() > 1e-3
    # a cropped map equals the same content inside a larger map whose extra part is excluded
    # only when nothing beyond the crop is reachable: compare against an explicit key mask
    index, mask = blk_mask.geometry((30, 33))
    assert torch.isinf(mask).any() and not torch.isinf(mask[8]).any()  # window (1, 1): inside
    rows = index[0, :49] // 35
    assert ((rows >= 30) | (index[0, :49] % 35 >= 33)).sum() == 0  # window (0,0) own: inside
    last = index[-1, :49]
    outside = (last // 35 >= 30) | (last % 35 >= 33)
    assert torch.equal(torch.isinf(mask[-1, :49]), outside)


def test_official_wrap_reads_the_opposite_border():
    blk = block(False)
    index, mask = blk.geometry((35, 35))
    rows = index[0, 49:181] // 35
    assert set(rows.tolist()) >= {32, 33, 34}  # top-left window, wrapped from the bottom
    assert not torch.isinf(mask).any() and (mask == -100).any()


# -- dense-prediction behaviour ------------------------------------------------------------------


@pytest.mark.parametrize('size,conv', [((32, 32), False), ((45, 61), True), ((29, 200), False),
                                       ((3, 5), True)])
def test_small_and_elongated_inputs(size, conv):
    model = small(use_conv_embed=conv).eval()
    with torch.no_grad():
        outs = model(torch.rand(2, 3, *size))
    h, w = math.ceil(size[0] / 4), math.ceil(size[1] / 4)
    for i, o in enumerate(outs):
        assert o.shape == (2, 16 * 2 ** i, h, w)
        assert torch.isfinite(o).all()
        h, w = math.ceil(h / 2), math.ceil(w / 2)


def test_batch_items_are_independent():
    model = randomise(small()).eval()
    x = torch.rand(3, 3, 50, 70)
    with torch.no_grad():
        together = model(x)
        alone = model(x[1:2])
    for a, b in zip(together, alone):
        torch.testing.assert_close(a[1:2], b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('pool', ['mean', 'max', 'conv'])
def test_other_pool_methods_and_levels(pool):
    model = small(pool_method=pool, focal_levels=(3, 3, 2, 1), focal_windows=(7, 5, 3, 1))
    model.init_weights()
    with torch.no_grad():
        outs = model.eval()(torch.rand(1, 3, 60, 90))
    assert outs[-1].shape == (1, 128, 2, 3) and all(torch.isfinite(o).all() for o in outs)


def test_out_norms_follow_out_indices_and_bad_arguments():
    model = small(out_indices=(1, 3))
    assert hasattr(model, 'norm1') and not hasattr(model, 'norm0')
    with pytest.raises(ValueError, match='focal_windows'):
        small(focal_windows=(7, 5, 3))
    with pytest.raises(ValueError, match='odd'):
        small(focal_windows=(7, 5, 4, 1))
    with pytest.raises(ValueError, match='expand_size'):
        small(expand_sizes=(7, 3, 3, 3))
    with pytest.raises(KeyError, match='pool_method'):
        small(pool_method='avg')
    with pytest.raises(ValueError, match='divisible'):
        FocalTransformer(dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[3, 2, 2, 4]))


def test_gradient_checkpointing_gives_the_same_gradients():
    plain = randomise(small())
    ckpt = small(with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.rand(1, 3, 40, 56)
    for model in (plain, ckpt):
        model.train()
        sum(o.square().mean() for o in model(x)).backward()
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize('dtype', AMP_DTYPES)
def test_autocast_forward_backward_matches_fp32(dtype):
    # odd size: padded windows, masked border keys (-inf logits) and pooled tokens that straddle
    # the border; every trainable parameter must get a finite gradient (amp_check)
    model = FocalTransformer('tiny', drop_path_rate=0.)
    model.init_weights()
    assert model.layers[0].blocks[0].attn.relative_position_bias_table_to_neighbors.std() > 0.01
    check_autocast_against_fp32(model, torch.rand(1, 3, 97, 131), dtype)


def test_window_partition_round_trip_and_layouts():
    x = torch.randn(2, 14, 21, 6)
    windows = window_partition(x, 7)
    assert windows.shape == (12, 49, 6)
    torch.testing.assert_close(windows[4].view(7, 7, 6), x[0, 7:14, 7:14], rtol=0, atol=0)
    per_head = window_partition(x, 7, num_heads=2)
    assert per_head.shape == (2, 6, 2, 49, 3)
    torch.testing.assert_close(per_head[1, 5, 1].view(7, 7, 3), x[1, 7:14, 14:21, 3:],
                               rtol=0, atol=0)
    for w in (windows, per_head):
        assert torch.equal(window_reverse(w, 7, 14, 21), x)
    assert pad_to_windows(x[:, :10, :15], 7).shape == (2, 14, 21, 6)
    assert pad_to_windows(x, 7) is x


def official_checkpoint(tmp_path, **kwargs):
    src = randomise(small(expand_sizes=(3, 3, 3, 0), **kwargs))
    sd = {k: v for k, v in src.state_dict().items() if not k.startswith('norm')}
    sd.update({'norm.weight': torch.ones(128), 'norm.bias': torch.zeros(128),
               'head.weight': torch.zeros(10, 128), 'head.bias': torch.zeros(10)})
    path = tmp_path / 'focal-tiny-is224.pth'
    torch.save({'model': sd}, path)
    return sd, path


def test_224_checkpoint_into_the_dense_model(tmp_path):
    sd, path = official_checkpoint(tmp_path)
    model = small(init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    key = 'layers.3.blocks.0.attn.relative_position_bias_table_to_neighbors'
    assert key not in sd and model.state_dict()[key].std() > 0.005  # stage 4: fresh init
    for k in ('layers.2.blocks.1.attn.relative_position_bias_table_to_windows.0',
              'layers.0.blocks.0.pool_layers.0.weight', 'layers.1.downsample.proj.weight'):
        torch.testing.assert_close(model.state_dict()[k], sd[k])


def test_tables_resized_by_exact_name(tmp_path):
    sd, path = official_checkpoint(tmp_path)
    # another window and focal windows: Swin and pooled tables resized, neighbours re-initialised
    model = small(window_size=9, expand_sizes=(3, 3, 3, 0), focal_windows=(9, 5, 3, 1))
    out = model.convert_weights(dict(sd))
    own = model.state_dict()
    assert out['layers.0.blocks.0.attn.relative_position_bias_table'].shape == (289, 1)
    assert out['layers.0.blocks.0.attn.relative_position_bias_table_to_windows.0'].shape == (
        1, 289)
    assert out['layers.1.blocks.0.attn.relative_position_bias_table_to_windows.0'].shape == (
        2, 169)
    assert 'layers.0.blocks.0.attn.relative_position_bias_table_to_neighbors' not in out
    for k in own:
        if 'index' in k or 'valid_ind' in k:
            assert torch.equal(out[k], own[k]), k
    const = {k: torch.full_like(v, 0.3) if 'to_windows' in k else v for k, v in sd.items()}
    out = model.convert_weights(const)
    torch.testing.assert_close(
        out['layers.2.blocks.0.attn.relative_position_bias_table_to_windows.0'],
        torch.full((2, (9 + 3 - 1) ** 2), 0.3))
    model.load_state_dict(out, strict=False)
    key = 'layers.0.blocks.0.pool_layers.0.weight'
    mean = model.convert_weights({key: torch.full((1, 49), 1 / 49)})
    torch.testing.assert_close(mean[key],
                               torch.full((1, 81), 1 / 81))
