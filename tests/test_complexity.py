"""GMACs and parameters: official FLatten counts, every attention product, get_flops."""
import importlib.util
import os.path as osp

import pytest
import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer
from mmengine.config import Config

import mmeffvit  # noqa: F401
from mmeffvit.models import FocusedLinearAttention, SpatialReductionAttention
from mmeffvit.ops.policy import policy
from mmeffvit.analysis import (analyze, backbone_complexity, build_classifier,
                               config_complexity)
from mmeffvit.analysis.models import cached_backbone_complexity

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

# flatten.md sec. 3 [count]: official classification models at 224² (final norm, pooling and
# the 1000-class head included), GMACs and parameters in millions
OFFICIAL = {
    ('FLattenSwin', 'tiny'): (4.48, 29.19),
    ('FLattenSwin', 'small'): (8.73, 50.51),
    ('FLattenSwin', 'base'): (15.42, 88.97),
    ('FLattenPVT', 'tiny'): (2.04, 12.15),
    ('FLattenPVT', 'small'): (4.03, 21.67),
    ('FLattenPVT', 'medium'): (7.04, 37.24),
    ('FLattenPVT', 'large'): (10.38, 50.65),
    ('FLattenPVTv2', 'b0'): (0.58, 3.59),
    ('FLattenPVTv2', 'b1'): (2.22, 12.93),
    ('FLattenPVTv2', 'b2'): (4.25, 22.55),
    ('FLattenCSWin', 'tiny'): (4.32, 21.20),
    ('FLattenCSWin', 'small'): (6.78, 35.45),
    ('FLattenCSWin', 'base'): (14.91, 74.87),
}


def _load_tool():
    path = osp.join(REPO_ROOT, 'tools', 'analysis', 'get_flops.py')
    spec = importlib.util.spec_from_file_location('_tool_get_flops', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _WithShape(nn.Module):
    """Tracing needs tensor-only inputs: bind the grid shape of an attention module."""

    def __init__(self, attn, hw):
        super().__init__()
        self.attn, self.hw = attn, hw

    def forward(self, x):
        return self.attn(x, self.hw)


@pytest.mark.parametrize('backbone,arch', list(OFFICIAL))
def test_official_classifier_counts(backbone, arch):
    """Each official GMACs figure within 1% (they agree to the printed two decimals)."""
    gmacs, mparams = OFFICIAL[(backbone, arch)]
    report = cached_backbone_complexity(backbone, arch, (224, 224), True)
    assert abs(report.gmacs / gmacs - 1) < 0.01, report.gmacs
    assert abs(report.gmacs - gmacs) <= 0.005 + 1e-9, report.gmacs
    assert abs(report.mparams - mparams) <= 0.005 + 1e-9, report.params
    # nothing was skipped: every traced operator is counted or known to be MAC-free
    assert report.unsupported_ops == {}
    # only FLatten-PVT's final norm is unused, as in the official model
    assert report.uncalled_modules == (['norm'] if backbone == 'FLattenPVT' else [])
    assert {'linear', 'conv'} <= set(report.by_operator)
    assert not any('norm' in op or 'softmax' in op for op in report.by_operator)


@pytest.mark.parametrize('use_reference_ops', [True, False])
@pytest.mark.parametrize('sr_ratio', [1, 2])
def test_focused_linear_attention_counts_every_product(use_reference_ops, sr_ratio):
    """Linears, q·mean(k), KᵀV, Q(KᵀV), the DWC and the reduction conv, analytically.

    The PyTorch reference spells the products out; the compiled operator (run when it is built)
    is a ``prim::PythonOp`` counted by its own handle: both must give the same number.
    """
    before = policy()
    c, h, hw, ks = 64, 2, (6, 8), 5
    d, n = c // h, hw[0] * hw[1]
    n_kv = (hw[0] // sr_ratio) * (hw[1] // sr_ratio)
    attn = FocusedLinearAttention(c, h, pe_size=(hw[0] // sr_ratio, hw[1] // sr_ratio),
                                  sr_ratio=sr_ratio)
    report = analyze(_WithShape(attn, hw), torch.rand(2, n, c),
                     use_reference_ops=use_reference_ops)
    linears = n * c * c + n_kv * c * 2 * c + n * c * c  # q, kv, proj
    attention = n * c + n_kv * c * d + n * c * d        # q·mean(k), KᵀV, Q(KᵀV) over all heads
    dwc = c * ks * ks * n_kv                             # d channels per head, h heads
    reduction = c * c * sr_ratio ** 2 * n_kv if sr_ratio > 1 else 0
    assert report.macs == 2 * (linears + attention + dwc + reduction)
    assert report.unsupported_ops == {}
    compiled = 'linear_attention' in report.by_operator
    assert compiled == (not use_reference_ops and _compiled_ops_built())
    assert policy() is before  # the switch does not leak


def _compiled_ops_built():
    try:
        from mmeffvit.ops import load_ext
    except ImportError:
        return False
    return load_ext() is not None


def test_scaled_dot_product_attention_is_counted():
    """mmengine skips SDPA; the handle charges B·h·N·n·d for QKᵀ and as much for AV."""
    c, h, hw, sr = 64, 4, (6, 8), 2
    n, n_kv = hw[0] * hw[1], (hw[0] // sr) * (hw[1] // sr)
    module = _WithShape(SpatialReductionAttention(c, h, sr_ratio=sr), hw)
    x = torch.rand(1, n, c)
    plain = FlopAnalyzer(module, (x, )).unsupported_ops_warnings(False)
    plain.total()
    assert 'aten::scaled_dot_product_attention' in plain.unsupported_ops()
    report = analyze(module, x)
    expected = 2 * n * c * c + n_kv * c * 2 * c + c * c * sr * sr * n_kv + 2 * n * n_kv * c
    assert report.macs == expected
    assert report.by_operator['scaled_dot_product_attention'] == 2 * n * n_kv * c
    assert report.unsupported_ops == {}


class LinearAttentionFunction(torch.autograd.Function):
    """Stand-in with the compiled operator's name: its products are invisible to the trace."""

    @staticmethod
    def forward(ctx, q, k, v):
        z = 1.0 / (q @ k.mean(-2, keepdim=True).transpose(-2, -1) + 1e-6)
        return (q @ (k.transpose(-2, -1) @ v)) * z


def test_compiled_linear_attention_handle_matches_the_reference_products():
    q, k, v = torch.rand(2, 3, 10, 8), torch.rand(2, 3, 12, 8), torch.rand(2, 3, 12, 5)

    class Compiled(nn.Module):
        def forward(self, q, k, v):
            return LinearAttentionFunction.apply(q, k, v)

    class Reference(nn.Module):
        def forward(self, q, k, v):
            return LinearAttentionFunction.forward(None, q, k, v)

    compiled, reference = analyze(Compiled(), (q, k, v)), analyze(Reference(), (q, k, v))
    assert compiled.macs == reference.macs == 2 * 3 * (10 * 8 + 12 * 8 * 5 + 10 * 8 * 5)
    assert compiled.by_operator == {'linear_attention': compiled.macs}


def test_matmul_follows_broadcasting():
    """mmengine's matmul handle undercounts a broadcast left operand; ours does not."""

    class Broadcast(nn.Module):
        def forward(self, a, b):
            return a @ b

    a, b = torch.rand(5, 7), torch.rand(2, 3, 7, 4)
    assert analyze(Broadcast(), (a, b)).macs == 2 * 3 * 5 * 7 * 4
    assert analyze(Broadcast(), (b.transpose(-2, -1), torch.rand(7, 6))).macs == 2 * 3 * 4 * 7 * 6


def test_elementwise_convention_switch():
    macs = backbone_complexity('FLattenPVTv2', 'b0', (64, 64))
    everything = backbone_complexity('FLattenPVTv2', 'b0', (64, 64), count_elementwise=True)
    assert 'layer_norm' not in macs.by_operator and everything.by_operator['layer_norm'] > 0
    extra = {k: v for k, v in everything.by_operator.items() if k not in macs.by_operator}
    assert everything.macs - sum(extra.values()) == macs.macs  # the products are the same


def test_classifier_layout_and_bad_names():
    model = build_classifier('mmeffvit.FLattenDeiT', 't')
    assert model.head.in_features == 192 and model.norm is None
    assert build_classifier('FLattenPVT', 'tiny').norm is not None  # built, never applied
    with pytest.raises(KeyError, match='FLattenPVT'):
        backbone_complexity('FlattenPTV', 'tiny')


def test_get_flops_backbone_mode(capsys):
    tool = _load_tool()
    lines = tool.main(['--backbone', 'FLattenSwin', '--arch', 'tiny', '--shape', '96', '--debug',
                       '--backbone-options', 'out_indices=(1,2)'])
    report = backbone_complexity('FLattenSwin', 'tiny', (96, 96), out_indices=(1, 2))
    text = '\n'.join(lines)
    assert f'{report.macs:,} multiply-adds' in text
    assert 'unsupported ops (neither counted nor known to be MAC-free): none' in text
    assert '1×3×96×96' in text and 'FLattenSwin tiny (backbone)' in text
    with pytest.raises(SystemExit):
        tool.main(['--arch', 'tiny'])  # neither a config nor --backbone


def test_config_mode_counts_the_same_backbone():
    """A tensor-mode detector: its backbone share equals the bare backbone's count."""
    shape = (128, 160)
    report, summary = config_complexity(
        osp.join(REPO_ROOT, 'configs', 'flatten', 'retinanet_flatten_pvtv2_b0_1x_coco.py'), shape)
    bare = backbone_complexity('FLattenPVTv2', 'b0', shape)
    assert summary['scope'] == 'mmdet' and summary['input_shape'] == shape
    assert summary['parts']['backbone'] == bare.macs
    assert summary['part_params']['backbone'] == bare.params
    assert summary['parts']['bbox_head'] > 0 and summary['parts']['neck'] > 0
    assert report.macs == sum(summary['parts'].values())
    assert report.unsupported_ops == {} and report.uncalled_modules == []


def test_get_flops_config_mode_on_a_segmentor(capsys):
    """mmseg through the tool: the auxiliary head is dropped (it does not run at inference)."""
    tool = _load_tool()
    path = osp.join(REPO_ROOT, 'configs', 'flatten', 'upernet_flatten_swin_t_160k_ade20k.py')
    assert 'auxiliary_head' in Config.fromfile(path).model
    lines = tool.main([path, '--shape', '64', '96'])
    bare = backbone_complexity('FLattenSwin', 'tiny', (64, 96))
    text = '\n'.join(lines)
    assert '(mmseg, tensor mode)' in text and '1×3×64×96' in text
    backbone = next(line for line in lines if line.strip().startswith('backbone'))
    assert f'({bare.macs:,} MACs)' in backbone
    assert any(line.strip().startswith('decode_head') for line in lines)
    assert 'auxiliary_head' not in text
    with pytest.raises(SystemExit):
        tool.main([path, '--with-head'])
