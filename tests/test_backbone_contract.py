"""What every registered mmeffvit backbone promises, checked on each (small configurations).

Build by plain and scoped name from mmdet / mmseg / mmpretrain; unknown arch names; odd input
sizes (ceil strides); ``out_indices``; ``frozen_stages`` and ``norm_eval`` through an optimizer
step; bf16 autocast; the default kernels against the reference; pretrained loading (own
weights round trip, missing file, wrong architecture, nothing matching). Family facts (counts,
golden outputs, key layouts) stay in the family test files.
"""
import copy
import logging
import math
from dataclasses import dataclass

import pytest
import torch
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope
from torch.nn.modules.batchnorm import _BatchNorm

import mmeffvit  # noqa: F401
from mmeffvit.models import EffBackbone
from mmeffvit.registry import MODELS

_PYRAMID = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2],
                depths=[1, 1, 1, 1])


@dataclass
class Case:
    """A small configuration of a backbone and what it must output on any input."""
    kwargs: dict
    channels: list          # of the default outputs
    strides: list           # of the default outputs
    subset: dict            # other out_indices (and what else they need)
    subset_channels: list
    subset_strides: list
    frozen_1: tuple         # parameter-name prefixes that frozen_stages=1 freezes, exactly
    input_multiple: int = 1  # the input is padded to this multiple before the strides apply


CASES = {
    'FLattenPVT': Case(
        dict(arch=dict(_PYRAMID, sr_ratios=[4, 2, 1, 1], attn_types='LSLL')),
        [16, 32, 48, 64], [4, 8, 16, 32], dict(out_indices=(1, 3)), [32, 64], [8, 32],
        ('patch_embed1.', 'pos_embed1', 'block1.')),
    'FLattenPVTv2': Case(
        dict(arch=dict(_PYRAMID, sr_ratios=[4, 2, 1, 1], attn_types='SLLS')),
        [16, 32, 48, 64], [4, 8, 16, 32], dict(out_indices=(1, 3)), [32, 64], [8, 32],
        ('patch_embed1.', 'block1.', 'norm1.')),
    'LaViT': Case(
        dict(arch=dict(_PYRAMID, sr_ratios=[8, 4, 2, 1], depths=[1, 1, 2, 2],
                       num_va_layers=[1, 1, 1, 1])),
        [16, 32, 48, 64], [4, 8, 16, 32], dict(out_indices=(1, 3)), [32, 64], [8, 32],
        ('patch_embed1.', 'pos_embed1', 'block1.')),
    'FLattenSwin': Case(
        dict(arch=dict(embed_dims=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4])),
        [16, 32, 64, 128], [4, 8, 16, 32], dict(out_indices=(1, 3)), [32, 128], [8, 32],
        ('patch_embed.', 'layers.0.', 'norm0.')),
    'FLattenCSWin': Case(
        dict(arch=dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4])),
        [16, 32, 64, 128], [4, 8, 16, 32], dict(out_indices=(1, 3)), [32, 128], [8, 32],
        ('stage1_conv_embed.', 'stage1.', 'norm0.')),
    'FLattenDeiT': Case(
        dict(arch=dict(embed_dims=32, num_heads=2, depth=4), out_type='featmap',
             with_pyramid=True),
        [8, 16, 32, 32], [4, 8, 16, 32],
        dict(out_indices=(1, 3), out_type='featmap', with_pyramid=False), [32, 32], [16, 16],
        ('patch_embed.', 'cls_token', 'pos_embed', 'blocks.0.'), input_multiple=16),
    'FocalTransformer': Case(
        dict(arch=dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4])),
        [16, 32, 64, 128], [4, 8, 16, 32], dict(out_indices=(1, 3)), [32, 128], [8, 32],
        ('patch_embed.', 'layers.0.', 'norm0.')),
    'CARE': Case(
        dict(arch=dict(depths=[1, 1, 1, 2], mem_dims=[4, 8, 8, 16], ratios=[(2, 2)] * 4,
                       head_dims=[None, None, 8, 8])),
        [16, 32, 32, 128], [4, 8, 16, 32], dict(out_indices=(1, 3)), [32, 128], [8, 32],
        ('stem.', 'stages.0.')),
    'L2ViT': Case(
        dict(arch=dict(embed_dims=[16, 32, 64, 128], depths=[2, 2, 2, 2],
                       num_heads=[1, 2, 4, 8])),
        [16, 32, 64, 128], [4, 8, 16, 32], dict(out_indices=(1, 3)), [32, 128], [8, 32],
        ('downsample_layers.0.', 'stages.0.', 'norm0.')),
}
NAMES = sorted(CASES)
SCOPES = ['mmdet', 'mmseg', 'mmpretrain']
SMALL_ODD = (57, 83)


def build(name, **kwargs):
    return MODELS.get(name)(**dict(CASES[name].kwargs, **kwargs))


def expected_shapes(case, channels, strides, hw):
    padded = [math.ceil(s / case.input_multiple) * case.input_multiple for s in hw]
    return [(1, c, math.ceil(padded[0] / s), math.ceil(padded[1] / s))
            for c, s in zip(channels, strides)]


def registered_backbones():
    return sorted(name for name, cls in MODELS.module_dict.items()
                  if isinstance(cls, type) and issubclass(cls, EffBackbone)
                  and cls is not EffBackbone)


def test_every_registered_backbone_has_a_case():
    assert registered_backbones() == NAMES


@pytest.mark.parametrize('scope', SCOPES)
@pytest.mark.parametrize('name', NAMES)
def test_builds_by_plain_and_scoped_name(scope, name):
    init_default_scope(scope)
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    for type_name in (name, f'mmeffvit.{name}'):
        model = registry.build(dict(type=type_name, **CASES[name].kwargs))
        assert type(model) is MODELS.get(name)


@pytest.mark.parametrize('name', NAMES)
def test_unknown_arch_lists_names_closest_first(name):
    cls = MODELS.get(name)
    first, *others = cls.arch_settings
    wrong = first + first[-1]  # e.g. 'tinyy', 's00'
    with pytest.raises(KeyError) as err:
        cls(arch=wrong)
    msg = str(err.value).strip('"\'')
    assert repr(wrong) in msg
    listed = msg.split('choose one of: ')[1].split(', ')
    assert listed[0] == first and set(others) <= set(listed)


@pytest.mark.parametrize('name', NAMES)
def test_odd_input_size_gives_ceil_strided_maps(name):
    case = CASES[name]
    hw = (333, 517)
    model = build(name).eval()
    with torch.no_grad():
        outs = model(torch.rand(1, 3, *hw))
    assert [tuple(o.shape) for o in outs] == expected_shapes(case, case.channels, case.strides,
                                                             hw)
    assert all(torch.isfinite(o).all() for o in outs)
    model = build(name, **case.subset).eval()
    with torch.no_grad():
        outs = model(torch.rand(1, 3, *SMALL_ODD))
    assert [tuple(o.shape) for o in outs] == expected_shapes(
        case, case.subset_channels, case.subset_strides, SMALL_ODD)


@pytest.mark.parametrize('name', NAMES)
def test_bad_out_indices_and_frozen_stages_are_errors(name):
    with pytest.raises(ValueError, match='out_indices'):
        build(name, out_indices=(99, ))
    model = build(name)
    with pytest.raises(ValueError, match='frozen_stages'):
        build(name, frozen_stages=model.num_stages + 1)


@pytest.mark.parametrize('name', NAMES)
def test_frozen_stages_and_norm_eval_survive_an_optimizer_step(name):
    frozen_prefixes = CASES[name].frozen_1
    torch.manual_seed(0)
    model = build(name, frozen_stages=1, norm_eval=True)
    model.train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, _ in model.named_parameters() if n.startswith(frozen_prefixes)}
    assert all(any(n.startswith(p) for n in frozen) for p in frozen_prefixes)
    for module_name, module in model.named_modules():
        if module_name.startswith(frozen_prefixes) or isinstance(module, _BatchNorm):
            assert not module.training, module_name
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    # random weights: a plain sum of LayerNorm outputs has no gradient w.r.t. their input
    sum((o * torch.randn_like(o)).sum() for o in model(torch.rand(2, 3, *SMALL_ODD))).backward()
    opt.step()
    after = model.state_dict()
    running = [k for k in before if k.endswith(('running_mean', 'running_var'))]
    for key in [k for k in before if k.startswith(frozen_prefixes)] + running:
        assert torch.equal(before[key], after[key]), key
    trained = [k for k, p in model.named_parameters() if p.requires_grad]
    assert any(not torch.equal(before[k], after[k]) for k in trained)


@pytest.mark.parametrize('name', NAMES)
def test_bf16_autocast_forward_backward_finite(name):
    model = build(name).train()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.rand(1, 3, *SMALL_ODD))
    assert all(o.dtype in (torch.bfloat16, torch.float32) for o in outs)
    loss = sum((o.float() * torch.randn(o.shape)).mean() for o in outs)
    loss.backward()
    assert torch.isfinite(loss)
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f'parameters without a gradient: {missing[:5]}'
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize('layout', ['raw', 'detector'])
@pytest.mark.parametrize('name', NAMES)
def test_own_weights_round_trip_through_init_cfg(name, layout, tmp_path):
    torch.manual_seed(0)
    source = build(name)
    weights = {k: torch.randn_like(v) if v.is_floating_point() else v
               for k, v in source.state_dict().items()}
    saved = weights if layout == 'raw' else dict(
        state_dict={f'backbone.{k}': v for k, v in weights.items()}, meta={})
    path = tmp_path / 'weights.pth'
    torch.save(saved, path)
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    loaded = model.state_dict()
    assert loaded.keys() == weights.keys()
    for key, value in weights.items():
        assert torch.equal(loaded[key], value), key


@pytest.fixture
def warnings_logged():
    """Messages of WARNING and above that mmengine's current logger receives in the test."""
    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    messages = []
    logger = MMLogger.get_current_instance()
    handler = Collect(level=logging.WARNING)
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


@pytest.mark.parametrize('name', NAMES)
def test_missing_checkpoint_warns_and_keeps_random_init(name, tmp_path, warnings_logged):
    torch.manual_seed(0)
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'none.pth')))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.init_weights()  # a warning, not an error
    assert any('not found' in m for m in warnings_logged)
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize('name', NAMES)
def test_checkpoint_of_another_architecture_is_a_clear_error(name, tmp_path):
    weights = build(name).state_dict()
    # one conv/linear weight of another width: the file belongs to another architecture
    key = next(k for k, v in weights.items() if k.endswith('weight') and v.dim() >= 2)
    weights[key] = torch.zeros(weights[key].shape[0] + 1, *weights[key].shape[1:])
    path = tmp_path / 'other_arch.pth'
    torch.save(weights, path)
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(RuntimeError, match='does not fit'):
        model.init_weights()


@pytest.mark.parametrize('name', NAMES)
def test_checkpoint_without_a_matching_key_is_a_clear_error(name, tmp_path):
    path = tmp_path / 'classifier.pth'
    torch.save({'classifier.weight': torch.zeros(3, 3)}, path)
    model = build(name, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    # BatchNorm families too: num_batches_tracked must not count as a match
    with pytest.raises(RuntimeError, match='does not fit .*: 0 of its'):
        model.init_weights()


@pytest.mark.parametrize('cpu_gemm', [None, 'onednn'])
@pytest.mark.parametrize('name', NAMES)
def test_default_kernels_match_the_reference(name, cpu_gemm):
    """Every backbone under the default policy (compiled operators, oneDNN or MKL linears, the
    CPU paths of the ops' entry points) against the same model under ``use_reference()``:
    inference outputs, and a training step's outputs and parameter gradients, fp32."""
    from mmeffvit import ops
    from mmeffvit.ops.policy import ONEDNN_LINEAR
    if cpu_gemm == 'onednn' and not ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    torch.manual_seed(0)
    model = build(name)
    with torch.no_grad():  # tables that start at zero would hide the bias paths
        for pname, p in model.named_parameters():
            if 'relative_position' in pname or 'bias_table' in pname:
                p.normal_(std=0.5)
    images = torch.rand(1, 3, 333, 517)
    crops = torch.rand(2, 3, 97, 131)
    weights, state = None, copy.deepcopy(model.state_dict())

    def run():
        nonlocal weights
        model.load_state_dict(state)  # the training step moved BatchNorm's running stats
        model.eval()
        with torch.no_grad():
            inference = model(images)
        model.train()
        torch.manual_seed(1)  # drop path and dropout draw the same
        outs = model(crops)
        if weights is None:
            weights = [torch.randn(o.shape) for o in outs]
        model.zero_grad()
        sum((o * w).sum() for o, w in zip(outs, weights)).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return inference, outs, grads

    with ops.use_reference():
        want = run()
    if cpu_gemm is None:
        got = run()
    else:
        with ops.use_kernels(required=False, cpu_gemm=cpu_gemm):
            got = run()
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert got[2].keys() == want[2].keys() and got[2]
    # a bias right before a BatchNorm gets a zero gradient up to rounding: tolerances relative
    # to the model's largest gradient
    scale = max(g.abs().max().item() for g in want[2].values())
    for key in want[2]:
        torch.testing.assert_close(got[2][key], want[2][key], rtol=1e-3, atol=1e-5 * scale,
                                   msg=lambda m, key=key: f'{key}: {m}')
