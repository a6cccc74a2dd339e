"""mmeffvit.ops.focused_qkv_attention (issue 47, step c) under use_reference() and use_kernels on
both CPU GEMMs: against the float64 composition of torch's linear, the reference focused linear
attention and conv2d, forward and backward (the fused Function), inference (the split
projection), with and without a positional encoding; bf16 under autocast."""
import importlib

import pytest
import torch
import torch.nn.functional as F

from mmeffvit import ops
from mmeffvit.ops.policy import ONEDNN_LINEAR

qkv_ops = importlib.import_module('mmeffvit.ops.focused_qkv_attention')  # shadowed in ops


@pytest.fixture
def path(kernel_path):
    """The policy of the test (conftest's ``kernel_path``)."""
    return kernel_path


def _case(batch=2, hw=(6, 7), c=24, heads=3, pe=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = hw[0] * hw[1]
    x = torch.randn(batch, n, 16, generator=g)
    params = dict(qkv_weight=torch.randn(3 * c, 16, generator=g) / 4,
                  qkv_bias=torch.randn(3 * c, generator=g) / 4,
                  scale=torch.empty(c).uniform_(-1, 1, generator=g),
                  dwc_weight=torch.randn(c // heads, 1, 5, 5, generator=g) / 5,
                  dwc_bias=torch.randn(c // heads, generator=g),
                  pe=torch.randn(1, n, c, generator=g) / 2 if pe else None)
    return x, params


def _composed64(x, qkv_weight, qkv_bias, scale, dwc_weight, dwc_bias, pe, hw, heads):
    d = (lambda t: None if t is None else t.double())
    q, k, v = F.linear(d(x), d(qkv_weight), d(qkv_bias)).chunk(3, -1)
    if pe is not None:
        k = k + d(pe)
    out = ops.focused_linear_attention_ref(q, k, v, d(scale), heads, 3)
    b, n, c = v.shape
    v_map = v.transpose(1, 2).reshape(b, c, *hw)
    dwc = F.conv2d(v_map, d(dwc_weight).repeat(heads, 1, 1, 1), d(dwc_bias).repeat(heads),
                   padding=2, groups=c)
    return out + dwc.flatten(2).transpose(1, 2)


def _call(x, p, hw=(6, 7), heads=3):
    return ops.focused_qkv_attention(x, p['qkv_weight'], p['qkv_bias'], p['scale'],
                                     p['dwc_weight'], p['dwc_bias'], hw, heads, 3, pe=p['pe'])


def _calls(monkeypatch):
    seen = []
    for owner, name in ((qkv_ops._QKVFocusedAttention, 'apply'),
                        (qkv_ops, '_split_projection_inference')):
        original = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, n=name, o=original: seen.append(n) or o(*a))
    return seen


@pytest.mark.parametrize('pe', [True, False])
def test_inference_equals_float64(path, pe, monkeypatch):
    x, p = _case(pe=pe)
    seen = _calls(monkeypatch)
    with torch.no_grad():
        out = _call(x, p)
    torch.testing.assert_close(out.double(), _composed64(x, **p, hw=(6, 7), heads=3),
                               rtol=1e-4, atol=1e-5)
    fused = path != 'reference' and ops.load_ext() is not None and ONEDNN_LINEAR
    assert seen == (['_split_projection_inference'] if fused else [])


@pytest.mark.parametrize('pe', [True, False])
@pytest.mark.parametrize('batch', [1, 2])
def test_gradients_equal_float64(path, pe, batch, monkeypatch):
    x, p = _case(batch=batch, pe=pe)
    leaves = {k: v.requires_grad_() for k, v in [('x', x)] + list(p.items()) if v is not None}
    seen = _calls(monkeypatch)
    out = _call(leaves['x'], p)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(out, list(leaves.values()), grad)
    fused = path != 'reference' and ops.load_ext() is not None and ONEDNN_LINEAR
    assert seen == (['apply'] if fused else [])
    leaves64 = {k: v.detach().double().requires_grad_() for k, v in leaves.items()}
    p64 = {k: leaves64.get(k) for k in p}
    want = torch.autograd.grad(_composed64(leaves64['x'], **p64, hw=(6, 7), heads=3),
                               list(leaves64.values()), grad.double())
    for name, g, w in zip(leaves, got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4, msg=name)


def test_autocast_bf16_runs_the_composed_operators(path, monkeypatch):
    x, p = _case()
    seen = _calls(monkeypatch)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        out = _call(x, p)
    assert not seen and out.dtype == torch.bfloat16  # q's dtype (sums in fp32 inside)
    torch.testing.assert_close(out.double(), _composed64(x, **p, hw=(6, 7), heads=3),
                               rtol=5e-2, atol=5e-2)
