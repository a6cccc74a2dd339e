"""CARE Transformer: official counts, key layout, attention, stage-4 options, loading.

The contract every backbone keeps is ``test_backbone_contract.py``.
"""
import pytest
import torch
import torch.nn.functional as F

import mmeffvit  # noqa: F401
from mmeffvit.models import CARE
from mmeffvit.models.backbones.care import TokenMixer
from mmeffvit.analysis import analyze
from mmeffvit.ops import load_ext
from amp_check import AMP_DTYPES, check_autocast_against_fp32
from golden_care_l2vit import check_stages, fill, load_record, official_state_dict

# counts of the official CARENets (care.md sec. 7): params with both heads (exact), backbone
# MACs at 224² = official MACs minus the two heads (2·cls_dim·1000), state_dict entries
OFFICIAL = {'s0': (7_340_000, 0.718, 567, 1024), 's1': (9_602_424, 1.029, 776, 1024),
            's2': (19_481_288, 1.923, 776, 1536)}


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def heads(cls_dim):
    """``head`` and ``dist_head``: LayerNorm(cls_dim) + Linear(cls_dim, 1000) each."""
    return 2 * (2 * cls_dim + cls_dim * 1000 + 1000)


@pytest.mark.parametrize('arch', list(OFFICIAL))
def test_parameter_counts_are_exactly_official(arch):
    params, _, entries, cls_dim = OFFICIAL[arch]
    with torch.device('meta'):
        model = CARE(arch)
    assert n_params(model) + heads(cls_dim) == params
    assert len(model.state_dict()) + 8 == entries
    assert model.out_channels[-1] == cls_dim


def test_residual_last_block_adds_exactly_gamma_and_projection():
    with torch.device('meta'):
        expanded, residual = CARE('s0'), CARE('s0', last_block='residual')
    extra = set(residual.state_dict()) - set(expanded.state_dict())
    assert extra == {'stages.3.blocks.3.gamma', 'stages.3.blocks.3.inter_layer.inter2_fc2.weight',
                     'stages.3.blocks.3.inter_layer.inter2_fc2.bias'}
    # inter2_fc2 1024->256 with bias (262,400, care.md sec. 11) + gamma (256)
    assert n_params(residual) - n_params(expanded) == 262_400 + 256
    assert residual.out_channels == [32, 64, 128, 256]


@pytest.mark.parametrize('arch', list(OFFICIAL))
def test_macs_match_official_with_and_without_compiled_ops(arch):
    """get_flops' count on the backbone (convs + the linear-attention products; BN left out as
    in DeepSpeed's MAC count) plus the two heads against the official MACs, with the compiled
    operator (counted by its handle) and with its reference (the traced matmuls)."""
    model = CARE(arch)
    x = torch.rand(1, 3, 224, 224)
    reports = [analyze(model, x, use_reference_ops=ref) for ref in (True, False)]
    heads = 2 * OFFICIAL[arch][3] * 1000
    for report in reports:
        assert not report.unsupported_ops
        assert round((report.macs + heads) / 1e9, 3) == OFFICIAL[arch][1], report.by_operator
    assert reports[0].macs == reports[1].macs
    if load_ext() is not None:  # without the build both reports trace the reference
        assert reports[0].by_operator['matmul'] == reports[1].by_operator['linear_attention'] > 0


def test_official_key_layout():
    sd = CARE('s0').state_dict()
    expected = {
        'stem.0.weight': (32, 3, 4, 4),
        'stem.1.running_mean': (32, ),
        'stages.1.downsample.0.weight': (32, ),
        'stages.1.downsample.1.weight': (64, 32, 2, 2),
        'stages.0.blocks.0.gamma': (32, ),
        'stages.0.blocks.0.token_mixer.dwconvatt_1.weight': (8, 1, 11, 1),
        'stages.0.blocks.0.token_mixer.dwconvatt_2.weight': (8, 1, 1, 11),
        'stages.0.blocks.0.token_mixer.dwconv1.weight': (8, 1, 3, 3),
        'stages.0.blocks.0.token_mixer.dwconv2.weight': (8, 1, 7, 7),
        'stages.2.blocks.0.token_mixer.qk.weight': (64, 32, 1, 1),
        'stages.0.blocks.0.inter_layer.inter1_fc1.weight': (48, 24, 1, 1),
        'stages.0.blocks.0.inter_layer.inter2_fc1.weight': (64, 32, 1, 1),
        'stages.3.blocks.3.inter_layer.inter2_fc1.weight': (1024, 256, 1, 1),
        'stages.3.blocks.3.inter_layer.inter2_conv.weight': (1024, 1, 3, 3),
        'stages.3.blocks.2.inter_layer.inter2_fc2.weight': (256, 1024, 1, 1),
    }
    for key, shape in expected.items():
        assert tuple(sd[key].shape) == shape, key
    assert 'stages.0.downsample.0.weight' not in sd
    assert 'stages.3.blocks.3.gamma' not in sd
    assert 'stages.3.blocks.3.inter_layer.inter2_fc2.weight' not in sd
    assert 'stages.2.blocks.0.token_mixer.dwconvatt_1.weight' not in sd
    assert torch.all(sd['stages.1.blocks.0.gamma'] == 1e-6)


def test_linear_attention_equals_naive_form():
    """A' = φ(q)ᵀ(1/N Σ φ(k) vᵀ) / (φ(q)ᵀ mean φ(k) + 1e-6), φ = ELU + 1, identity value,
    written with an explicit N×N matrix; heads own consecutive channel groups."""
    torch.manual_seed(0)
    mixer = TokenMixer(6, head_dims=3).double()
    x = torch.randn(2, 6, 5, 7, dtype=torch.float64)
    out = mixer.attention(x)
    q, k = mixer.qk(x).flatten(2).chunk(2, dim=1)  # (B, 6, N)
    v = x.flatten(2)
    ref = []
    for h in range(2):
        sl = slice(3 * h, 3 * h + 3)
        qh, kh, vh = (F.elu(q[:, sl]) + 1).transpose(1, 2), (F.elu(k[:, sl]) + 1), v[:, sl]
        sim = qh @ kh / 35  # (B, N, N)
        ref.append(((sim @ vh.transpose(1, 2)) / (sim.sum(-1, keepdim=True) + 1e-6)))
    ref = torch.cat(ref, dim=-1).transpose(1, 2).reshape(2, 6, 5, 7)
    torch.testing.assert_close(out, ref)


def test_mixer_split_order_and_bypass():
    mixer = TokenMixer(4, head_dims=None).eval()
    x = torch.randn(1, 16, 9, 9)
    mem, feats = mixer(x)
    assert torch.equal(mem, x[:, :4])  # memory first, untouched
    torch.testing.assert_close(feats[:, 4:8], mixer.dwconv1(x[:, 8:12]))
    torch.testing.assert_close(feats[:, 8:], mixer.dwconv2(x[:, 12:]))
    with pytest.raises(ValueError, match='divisible'):
        TokenMixer(6, head_dims=4)


def test_both_stage4_outputs():
    for mode, c4 in (('expanded', 1024), ('residual', 256)):
        model = CARE('s0', last_block=mode).eval()
        assert model.out_channels == [32, 64, 128, c4]
        with torch.no_grad():
            outs = model(torch.rand(1, 3, 61, 77))
        assert [o.shape[1] for o in outs] == model.out_channels


def test_last_block_drop_path_off_by_default():
    model = CARE('s0', drop_path_rate=0.5)
    assert isinstance(model.stages[3].blocks[3].drop_path, torch.nn.Identity)
    assert model.stages[3].blocks[2].drop_path.drop_prob > 0.4
    model = CARE('s0', drop_path_rate=0.5, last_block_drop_path=True)
    assert model.stages[3].blocks[3].drop_path.drop_prob == pytest.approx(0.5)


def test_bad_arguments():
    with pytest.raises(KeyError, match='last_block'):
        CARE('s0', last_block='none')


def test_official_raw_state_dict_loads_through_init_cfg(tmp_path):
    torch.manual_seed(0)
    sd = {k: torch.randn_like(v.float()).to(v.dtype) for k, v in CARE('s0').state_dict().items()}
    for head in ('head', 'dist_head'):
        sd.update({f'{head}.norm.weight': torch.ones(1024), f'{head}.norm.bias': torch.zeros(1024),
                   f'{head}.fc.weight': torch.zeros(1000, 1024),
                   f'{head}.fc.bias': torch.zeros(1000)})
    path = tmp_path / 'CARETrans_S0.pth.tar'
    torch.save(sd, path)
    model = CARE('s0', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    own = model.state_dict()
    assert set(own) == {k for k in sd if 'head.' not in k}
    assert all(torch.equal(own[k], sd[k]) for k in own)
    # the residual variant loads all but the last block's gamma/inter2_fc2
    model = CARE('s0', last_block='residual',
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert torch.equal(model.stem[0].weight, sd['stem.0.weight'])


def test_random_init_is_official():
    model = CARE('s0')
    model.init_weights()
    w = model.stages[2].blocks[0].inter_layer.inter2_fc1.weight
    assert abs(w.std().item() - 0.02) < 0.002
    assert torch.count_nonzero(model.stages[2].blocks[0].token_mixer.qk.bias) == 0


@pytest.mark.parametrize('dtype', AMP_DTYPES)
def test_autocast_forward_backward_matches_fp32(dtype):
    # odd size (stem and downsampling pads), LayerScale large enough for every block to count;
    # the linear attention of stages 3-4 runs in fp32 inside (TokenMixer.attention)
    model = CARE('s0', layer_scale_init=0.5)
    model.init_weights()
    check_autocast_against_fp32(model, torch.rand(1, 3, 97, 131), dtype)


def _golden_model(record, tmp_path):
    kw = record['official_kwargs']
    arch = dict(CARE.arch_settings['s0' if '0' in record['official_factory'] else 's2'])
    if 'depths' in kw:  # a custom CARENets configuration
        arch = dict(depths=list(kw['depths']), mem_dims=list(kw['mem_dims']),
                    ratios=[tuple(r) for r in kw['ratios']],
                    head_dims=[None, None] + list(kw['att_head_dim'][2:]))
    official = official_state_dict(record)
    path = tmp_path / 'official.pth'
    torch.save(official, path)
    model = CARE(arch, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    return model.double().eval(), official


# the full-size records run in float64 for about a minute each on a busy CPU: -m slow
@pytest.mark.parametrize('name', ['care_small_96x160',
                                  pytest.param('care_s0_224', marks=pytest.mark.slow),
                                  pytest.param('care_s2_160x224', marks=pytest.mark.slow)])
def test_golden_outputs_equal_official(name, tmp_path, request):
    record = load_record('care', name)
    model, official = _golden_model(record, tmp_path)
    with torch.no_grad():
        outs = model(record['input'].double())
    check_stages(outs, record)
    if record.get('logits') is not None:  # the official two-head classifier on our stage 4
        feats = F.gelu(outs[-1].mean((2, 3)))
        logits = 0
        for head in ('head', 'dist_head'):
            w = {k: official[f'{head}.{k}'].double() for k in
                 ('norm.weight', 'norm.bias', 'fc.weight', 'fc.bias')}
            x = F.layer_norm(feats, feats.shape[-1:], w['norm.weight'], w['norm.bias'], 1e-6)
            logits = logits + F.linear(x, w['fc.weight'], w['fc.bias']) / 2
        torch.testing.assert_close(logits, record['logits'], rtol=1e-9, atol=1e-9)


def test_golden_fill_rule_reproduces_stored_weights():
    record = load_record('care', 'care_small_96x160')
    for key, value in record['state_dict'].items():
        if not key.endswith('num_batches_tracked'):
            assert torch.equal(fill(key, value.shape), value), key
