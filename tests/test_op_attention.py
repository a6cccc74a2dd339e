"""mmeffvit.ops.attention, scored_attention and softmax_values (issue 47, step a) under
use_reference() and use_kernels on both CPU GEMMs: against the float64 softmax attention,
forward and backward, with a bias, a key mask, value widths other than the keys', strided heads;
and the kernel each path runs (oneDNN row blocks, SDPA, explicit scores)."""
import importlib

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from mmeffvit import ops
from mmeffvit.ops.policy import ONEDNN_LINEAR

attention_ops = importlib.import_module('mmeffvit.ops.attention')  # ops.attention: the function


@pytest.fixture
def path(kernel_path):
    """The policy of the test (conftest's ``kernel_path``)."""
    return kernel_path


def _attention64(q, k, v, scale, bias=None, key_mask=None):
    scores = q.double() @ k.double().transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + bias.double()
    if key_mask is not None:
        scores = scores.masked_fill(key_mask, float('-inf'))
    probs = scores.softmax(-1)
    return probs @ v.double(), scores, probs


def _inputs(b=2, h=2, n=37, nk=19, d=16, e=16, seed=0, strided=False):
    g = torch.Generator().manual_seed(seed)
    if strided:  # heads as views into one (B, N, 3, H, d) projection
        qkv = torch.randn(b, n, 3, h, d, generator=g)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        return q, k, v
    return (torch.randn(b, h, n, d, generator=g), torch.randn(b, h, nk, d, generator=g),
            torch.randn(b, h, nk, e, generator=g))


def _called(fn):
    with profile() as prof:
        fn()
    return {e.key for e in prof.key_averages()}


@pytest.mark.parametrize('case', ['plain', 'bias', 'key mask', 'bias and mask', 'wide values',
                                  'narrow values', 'strided'])
def test_attention_inference_equals_float64(path, case):
    q, k, v = _inputs(strided=case == 'strided',
                      e={'wide values': 24, 'narrow values': 8}.get(case, 16))
    g = torch.Generator().manual_seed(1)
    bias = torch.randn(1, 2, q.shape[2], k.shape[2], generator=g) if 'bias' in case else None
    key_mask = None
    if 'mask' in case:
        key_mask = torch.zeros(2, 1, 1, k.shape[2], dtype=torch.bool)
        key_mask[1, ..., -5:] = True
    with torch.no_grad():
        out = ops.attention(q, k, v, scale=0.25, bias=bias, key_mask=key_mask)
        called = _called(lambda: ops.attention(q, k, v, scale=0.25, bias=bias,
                                               key_mask=key_mask))
    assert out.shape == (*q.shape[:3], v.shape[-1])
    torch.testing.assert_close(out.double(), _attention64(q, k, v, 0.25, bias, key_mask)[0],
                               rtol=1e-5, atol=1e-5)
    # oneDNN's row blocks where the linears run oneDNN and nothing is added to the scores
    row_blocks = path == 'onednn' and bias is None and key_mask is None
    assert ('mkldnn::_linear_pointwise' in called) == row_blocks
    assert ('aten::scaled_dot_product_attention' in called) == (not row_blocks)


@pytest.mark.parametrize('case', ['plain', 'bias', 'bias needs grad', 'key mask'])
def test_attention_gradients_equal_float64(path, case):
    q, k, v = (t.requires_grad_() for t in _inputs(e=8))
    leaves = [q, k, v]
    bias = key_mask = None
    if 'bias' in case:
        bias = torch.randn(2, 1, q.shape[2], k.shape[2],
                           generator=torch.Generator().manual_seed(3))
        if case == 'bias needs grad':
            leaves.append(bias.requires_grad_())
    if case == 'key mask':
        key_mask = torch.zeros(2, 1, 1, k.shape[2], dtype=torch.bool)
        key_mask[0, ..., :4] = True
    out = ops.attention(q, k, v, scale=0.25, bias=bias, key_mask=key_mask)
    called = _called(lambda: ops.attention(q, k, v, scale=0.25, bias=bias, key_mask=key_mask))
    # a CPU bias that needs a gradient: explicit scores, stored once (_SoftmaxValues)
    assert ('aten::scaled_dot_product_attention' in called) == (case != 'bias needs grad')
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    got = torch.autograd.grad(out, leaves, grad)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref = _attention64(*leaves64[:3], 0.25, leaves64[3] if len(leaves64) > 3 else bias,
                       key_mask)[0]
    want = torch.autograd.grad(ref, leaves64, grad.double())
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_.double(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('need_probs', [False, True])
@pytest.mark.parametrize('grad', [False, True])
def test_scored_attention_keeps_the_scores(path, need_probs, grad, monkeypatch):
    """Scores ``(q·scale) kᵀ + bias`` (mask not applied to them), probabilities where asked,
    the output ``(B, N, H, e)``; in inference without probabilities by blocks of query rows
    (3 rows per block here)."""
    monkeypatch.setattr(attention_ops, '_SCORE_BLOCK_ELEMENTS', 2 * 2 * 19 * 3)
    q, k, v = (t.requires_grad_(grad) for t in _inputs(e=8))
    bias = torch.randn(2, 2, 37, 19, generator=torch.Generator().manual_seed(5))
    blocks = []
    blocked = attention_ops._blocked_scores_attention
    monkeypatch.setattr(attention_ops, '_blocked_scores_attention',
                        lambda *args: blocks.append(1) or blocked(*args))
    with torch.set_grad_enabled(grad):
        out, scores, probs = ops.scored_attention(q, k, v, 0.25, bias, need_probs=need_probs)
    ref_out, ref_scores, ref_probs = _attention64(q, k, v, 0.25, bias)
    assert out.shape == (2, 37, 2, 8) and bool(blocks) == (not need_probs and not grad)
    torch.testing.assert_close(out.double(), ref_out.transpose(1, 2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores.double(), ref_scores, rtol=1e-5, atol=1e-5)
    assert (probs is None) == (not need_probs and not grad)
    if probs is not None:
        torch.testing.assert_close(probs.double(), ref_probs, rtol=1e-5, atol=1e-5)
    if grad:  # the scores are stored, not the probabilities
        assert type(out.grad_fn).__name__ == 'TransposeBackward0'
        assert 'SoftmaxValues' in type(out.grad_fn.next_functions[0][0]).__name__


def test_softmax_values_with_a_key_mask_and_dropout():
    """A key mask is applied to the softmax only; dropout acts on the weights (same draws as
    ``F.dropout`` with the same seed); the probabilities returned are before dropout."""
    g = torch.Generator().manual_seed(6)
    scores, v = torch.randn(2, 2, 9, 7, generator=g), torch.randn(2, 2, 7, 4, generator=g)
    key_mask = torch.zeros(2, 1, 1, 7, dtype=torch.bool)
    key_mask[1, ..., 5:] = True
    out, probs = ops.softmax_values(scores, v, key_mask)
    ref_probs = scores.masked_fill(key_mask, float('-inf')).softmax(-1)
    torch.testing.assert_close(probs, ref_probs)
    torch.testing.assert_close(out, ref_probs @ v)
    torch.manual_seed(0)
    out, probs = ops.softmax_values(scores, v, dropout=0.5)
    torch.manual_seed(0)
    torch.testing.assert_close(out, F.dropout(scores.softmax(-1), 0.5) @ v)
    torch.testing.assert_close(probs, scores.softmax(-1))


def test_onednn_attention_equals_softmax_attention_by_row_blocks():
    """Blocks of query rows (3 here, the last short), two heads, a batch of two, a value width
    other than the key's: equal to the explicit softmax in float64."""
    if not ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    torch.manual_seed(7)
    q, k = torch.randn(2, 2, 5000, 16), torch.randn(2, 2, 1025, 16)
    v = torch.randn(2, 2, 1025, 24)
    out = attention_ops.onednn_attention(q, k, v, 0.25)
    torch.testing.assert_close(out, _attention64(q, k, v, 0.25)[0].float(), rtol=1e-5,
                               atol=1e-5)
    out1 = attention_ops.onednn_attention(q[:, :, :3], k, v[..., :16], 1.)
    ref1 = F.scaled_dot_product_attention(q[:, :, :3], k, v[..., :16], scale=1.)
    torch.testing.assert_close(out1, ref1, rtol=1e-5, atol=1e-5)
    # strided heads (views into one projection) in, a strided view out
    q2, k2, v2 = _inputs(b=2, n=300, h=2, d=16, strided=True)
    buffer = torch.full((2, 300, 2, 16), float('nan'))
    out2 = attention_ops.onednn_attention(q2, k2, v2, 0.25, out=buffer.transpose(1, 2))
    assert out2.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(buffer.transpose(1, 2), _attention64(q2, k2, v2, 0.25)[0].float(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kernel', ['onednn', 'aten'])
def test_onednn_attention_applies_in_cpu_inference_where_linears_run_onednn(switch_kernels,
                                                                            kernel):
    switch_kernels(required=False, cpu_gemm=kernel)
    q, k = torch.randn(1, 1, 8, 4), torch.randn(1, 1, 6, 4)
    applies = attention_ops.onednn_attention_applies
    with torch.no_grad():
        assert applies(q, k, k) == (kernel == 'onednn' and ONEDNN_LINEAR)
        assert not applies(q, k, k, dropout=0.1)
        assert not applies(q.double(), k.double(), k.double())
    assert not applies(q.requires_grad_(), k, k)


def _valid(per_image, n, real):
    """``(per_image, n)``: every window of an image whole but the last, which has ``real``
    real tokens (a CSWin stripe padded at its end)."""
    valid = torch.ones(per_image, n, dtype=torch.bool)
    valid[-1, real:] = False
    return valid


@pytest.mark.parametrize('per_image, real', [(3, 5), (1, 7), (4, 12)])
@pytest.mark.parametrize('grad', [False, True])
def test_attention_in_padded_windows_equals_float64_on_the_real_tokens(path, per_image, real,
                                                                       grad):
    """``valid``: each window's real queries equal attention over its real keys only (padding
    rows are the caller's to crop); the oneDNN row blocks attend the real tokens alone (no
    SDPA), elsewhere SDPA with the mask; gradients of the real rows equal float64's."""
    b, n = 2, 12
    q, k, v = (t.requires_grad_(grad) for t in _inputs(b=b * per_image, n=n, nk=n, e=8))
    valid = _valid(per_image, n, real)
    with torch.set_grad_enabled(grad):
        out = ops.attention(q, k, v, scale=0.25, valid=valid)
        called = _called(lambda: ops.attention(q, k, v, scale=0.25, valid=valid))
    assert out.shape == (b * per_image, 2, n, 8)
    row_blocks = path == 'onednn' and not grad
    assert ('aten::scaled_dot_product_attention' in called) == (not row_blocks)
    keep = valid.repeat(b, 1)[:, None, :, None]  # the real rows of each window
    ref = _attention64(q, k, v, 0.25, key_mask=~valid.repeat(b, 1)[:, None, None, :])[0]
    torch.testing.assert_close(out.double() * keep, ref * keep, rtol=1e-5, atol=1e-5)
    if row_blocks:
        assert torch.equal(out * ~keep, torch.zeros_like(out))  # skipped, zero
    if grad:
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(8)) * keep
        got = torch.autograd.grad(out, (q, k, v), grad_out)
        leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
        ref = _attention64(*leaves64, 0.25, key_mask=~valid.repeat(b, 1)[:, None, None, :])[0]
        want = torch.autograd.grad(ref, leaves64, grad_out.double())
        for g_, w in zip(got, want):
            torch.testing.assert_close(g_.double(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kwargs, message', [
    (dict(valid=torch.ones(3, 19, dtype=torch.bool)), 'W dividing the batch'),
    (dict(valid=torch.ones(2, 18, dtype=torch.bool)), 'valid must be'),
    (dict(valid=torch.ones(2, 19, dtype=torch.bool), bias=torch.zeros(1)), 'excludes bias'),
])
def test_attention_rejects_bad_valid(kwargs, message):
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=message):
        ops.attention(q, k, v, scale=0.25, **kwargs)
