"""Golden tests: mmeffvit's FLatten backbones against the OFFICIAL implementation.

``tests/data/golden/flatten/*.pt`` hold what the official code (LeapLabTHU/FLatten-Transformer,
HEAD abdb115) computed in float64 for fixed inputs and deterministic weights (see
``tests/data/golden/README.md``). Each test builds the corresponding mmeffvit backbone, loads the
official-layout weights through the public path (``init_cfg=Pretrained`` → ``convert_weights``),
runs the same input in float64 and compares every stage's tokens at the point the official
model hands them on (after the stage's last block; PVTv2 after ``norm{i}``), and the logits
recomputed from our last stage with the official ``norm``/``head`` weights.

A backbone class that does not exist yet is skipped (only that class), so its tests start to
run as soon as it lands.
"""
import copy

import pytest
import torch

import mmeffvit.models as mm_models
from golden_utils import (golden_fill, golden_input, golden_state_dict, layer_norm_head_logits,
                          load_golden, map_to_tokens)

TOL = dict(rtol=1e-5, atol=1e-5)
FAMILY = 'flatten'

# golden record -> (mmeffvit class, constructor kwargs, final norm of the official classifier)
_PVT_SMALL = dict(embed_dims=[8, 16, 24, 32], num_heads=[1, 2, 3, 4], mlp_ratios=[8, 8, 4, 4])
CASES = {
    'pvt_t_224': ('FLattenPVT', dict(arch='tiny', pretrain_img_size=224), None),
    'pvt_small_64': ('FLattenPVT', dict(arch=dict(_PVT_SMALL, depths=[1, 1, 2, 1]),
                                        pretrain_img_size=64), None),
    # 'S' (PVT spatial-reduction softmax) stages mixed in: official sr_ratios [8,4,2,1] apply to
    # the 'S' stages only, the 'L' ones use la_sr_ratios '1111'
    'pvt_small_mixed_64': ('FLattenPVT', dict(
        arch=dict(_PVT_SMALL, depths=[1, 2, 1, 1], attn_types='LSLS', sr_ratios=[1, 4, 1, 1]),
        pretrain_img_size=64), None),
    'pvt_v2_b0_224': ('FLattenPVTv2', dict(arch='b0', pretrain_img_size=224), None),
    'pvt_v2_small_64': ('FLattenPVTv2', dict(arch=dict(_PVT_SMALL, depths=[1, 1, 2, 1]),
                                             pretrain_img_size=64), None),
    # official_window_rule: the official S blocks use one unshifted window when the stage map
    # is not larger than the window (stage 4 at 224: 7x7)
    'swin_t_224': ('FLattenSwin', dict(arch='tiny', pretrain_img_size=224, window_size=7,
                                       attn_type='LLSS', official_window_rule=True), 'norm'),
    'swin_small_224': ('FLattenSwin', dict(
        arch=dict(embed_dims=4, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4]),
        pretrain_img_size=224, window_size=7, attn_type='LLSS', official_window_rule=True),
        'norm'),
    # out_norm=False: the official model has no per-stage norms, compare the raw stage tokens
    'cswin_t_224': ('FLattenCSWin', dict(arch='tiny', attn_types='LLSS', out_norm=False),
                    'norm'),
    'cswin_small_64': ('FLattenCSWin', dict(
        arch=dict(embed_dims=4, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4]),
        pretrain_img_size=64, split_sizes=[1, 2, 2, 2], attn_types='LLSS', out_norm=False),
        'norm'),
}
SMALL = [name for name in CASES if not name.endswith('_224') or 'small' in name]

# own parameters an official checkpoint cannot hold: the dense per-stage out-norms
_ALLOWED_MISSING = ('norm0.', 'norm1.', 'norm2.', 'norm3.')


def backbone_class(name):
    """The mmeffvit backbone class ``name``; skips (this test only) while it does not exist."""
    cls = getattr(mm_models, name, None)
    if cls is None:
        pytest.skip(f'mmeffvit.models.{name} does not exist yet')
    return cls


def official_state_dict(record):
    if record.get('state_dict') is not None:
        return record['state_dict']
    return golden_state_dict(record['param_shapes'])


def build_loaded(name, record, tmp_path):
    """The mmeffvit backbone for ``name`` with the golden weights loaded via ``init_cfg``.

    Returns the model (float64, eval) and the official-layout state dict it was loaded from.
    """
    cls_name, kwargs, _ = CASES[name]
    cls = backbone_class(cls_name)
    official = official_state_dict(record)
    ckpt = tmp_path / f'{name}_official.pth'
    torch.save({'model': official}, ckpt)
    model = cls(drop_path_rate=0., init_cfg=dict(type='Pretrained', checkpoint=str(ckpt)),
                **copy.deepcopy(kwargs))
    model.init_weights()
    return model.double().eval(), official


@pytest.fixture(scope='module', params=list(CASES))
def golden(request, tmp_path_factory):
    """``(name, record, model, official state dict)`` of one configuration.

    Module scope with parameters: pytest groups the tests by configuration, so each model is
    built once and only one is alive at a time.
    """
    name = request.param
    record = load_golden(FAMILY, name)
    model, official = build_loaded(name, record, tmp_path_factory.mktemp(name))
    return name, record, model, official


def stage_tokens(model, image):
    """Per-stage ``(B, N, C)`` tokens of ``model`` at the official hand-off points."""
    swin = type(model).__name__ == 'FLattenSwin'
    recorded, hooks = [], []
    if swin:  # compare before the dense out-norms norm{i}, which the official model lacks
        hooks = [layer.blocks[-1].register_forward_hook(
            lambda mod, args, out: recorded.append(out)) for layer in model.layers]
    try:
        with torch.no_grad():
            outs = model(image)
    finally:
        for hook in hooks:
            hook.remove()
    return recorded if swin else [map_to_tokens(o) for o in outs]


def test_stage_outputs_and_logits_match_official(golden):
    name, record, model, official = golden
    image = golden_input(FAMILY, record).double()
    tokens = stage_tokens(model, image)

    assert [list(t.shape) for t in tokens] == record['stage_shapes']
    for i, (ours, ref) in enumerate(zip(tokens, record['stages'])):
        if record['full_size']:
            flat = ours.flatten()
            torch.testing.assert_close(flat[::record['stride']], ref, **TOL,
                                       msg=lambda m: f'{name} stage {i}: {m}')
            abs_sum = record['stage_abs_sums'][i]
            assert abs(flat.abs().sum().item() - abs_sum) <= 1e-5 * abs_sum, (name, i)
            assert abs(flat.sum().item() - record['stage_sums'][i]) <= 1e-5 * abs_sum, (name, i)
        else:
            torch.testing.assert_close(ours, ref, **TOL, msg=lambda m: f'{name} stage {i}: {m}')

    norm_key = CASES[name][2]
    logits = layer_norm_head_logits(tokens[-1], official, norm_key)
    torch.testing.assert_close(logits, record['logits'], **TOL)


def test_official_checkpoint_fills_every_parameter(golden):
    """Everything but the dense out-norms comes from the official checkpoint, nothing is left."""
    _, _, model, official = golden
    converted = model.convert_weights(dict(official))
    own = model.state_dict()
    missing = [k for k in own if k not in converted and not k.startswith(_ALLOWED_MISSING)]
    assert not missing, missing
    # only classifier pieces and fixed-size buffers may be dropped
    dropped = [k for k in official if k not in own]
    assert all(k.startswith(('head.', 'norm.')) or k.endswith('attn_mask') for k in dropped), \
        dropped
    for key, value in converted.items():
        if key in own and not key.endswith('relative_position_index'):
            assert torch.equal(own[key], value.to(own[key].dtype)), key


@pytest.mark.parametrize('name', SMALL)
def test_fill_rule_reproduces_stored_weights(name):
    """golden_utils.golden_fill is the rule the generator used (so the big configs are right)."""
    record = load_golden(FAMILY, name)
    buffers = set(record['buffer_keys'])
    for key, value in record['state_dict'].items():
        if key not in buffers:
            assert torch.equal(golden_fill(key, value.shape), value), key


@pytest.mark.slow
def test_stage_outputs_match_official_on_the_triton_kernels(golden):
    """The same records in fp32 with the Triton kernels selected (interpreted without a GPU):
    the focused linear, windowed and stripe attentions on ``mmeffvit::`` ops, within fp32 tolerance
    of the official float64 outputs."""
    from mmeffvit import ops
    from mmeffvit.analysis.kernel_count import KernelCounter
    pytest.importorskip('triton')
    name, record, model, _ = golden
    model = copy.deepcopy(model).float()
    image = golden_input(FAMILY, record).float()
    with ops.use_kernels(required=False, triton=True), KernelCounter() as counter:
        tokens = stage_tokens(model, image)
    assert counter.count.by_op['mmeffvit.focused_linear_attention'] > 0
    if 'cswin' in name.lower():  # its stripes on their op too
        assert counter.count.by_op['mmeffvit.stripe_attention'] > 0
    for i, (ours, ref) in enumerate(zip(tokens, record['stages'])):
        ours = ours.double().flatten()[::record['stride']] if record['full_size'] else ours
        torch.testing.assert_close(ours.double(), ref, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f'{name} stage {i}: {m}')
