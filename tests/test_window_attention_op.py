"""mmeffvit.ops.window_attention: the compiled CPU operator against an explicit float64 softmax,
its fallbacks, argument checks, and the window attention of the models that call it."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmeffvit import ops
from mmeffvit.models.layers.relative_position import WindowMSA
from mmeffvit.ops import window_attention, window_attention_ref
from mmeffvit.ops.window_attention import window_attention_applies

needs_ext = pytest.mark.skipif(
    ops.load_ext() is None or not hasattr(ops.load_ext(), 'window_attention_forward'),
    reason='mmeffvit._ext is not built')


@pytest.fixture
def ops_on(monkeypatch):
    monkeypatch.setenv('MMEFFVIT_OPS', '1')


def naive(q, k, v, mask, scale):
    """Explicit float64 ``softmax(q·kᵀ·scale + mask)·v``, heads merged (independent of both)."""
    scores = q.double() @ k.double().transpose(-2, -1) * scale
    if mask is not None:
        scores = scores + mask.double()
    out = scores.softmax(-1) @ v.double()
    bw, h, n, d = q.shape
    return out.transpose(1, 2).reshape(bw, n, h * d)


def qkv_views(bw, n, heads, d, generator):
    """q, k, v as the per-head views of one fused projection (BW, n, 3·h·d), as the models
    make them (strided, unit stride in the last dim)."""
    projected = torch.randn(bw, n, 3 * heads * d, generator=generator)
    q, k, v = projected.view(bw, n, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, v


@needs_ext
@pytest.mark.parametrize('n,d', [(49, 32), (16, 24), (1, 8), (144, 32)])
@pytest.mark.parametrize('mask_shape', [None, (1, 3, None, None), (5, 1, None, None),
                                        (5, 3, None, None)])
def test_matches_explicit_softmax(ops_on, n, d, mask_shape):
    g = torch.Generator().manual_seed(n * 100 + d)
    q, k, v = qkv_views(5, n, 3, d, g)
    mask = None
    if mask_shape is not None:
        mask = torch.randn(mask_shape[0], mask_shape[1], n, n, generator=g) * 3
        # Swin's shift mask: -100 between regions
        mask = mask.masked_fill(torch.rand(mask.shape, generator=g) < 0.3, -100.)
    scale = d ** -0.5
    assert window_attention_applies(q, k, v, mask)
    out = window_attention(q, k, v, mask, scale)
    assert out.shape == (5, n, 3 * d) and out.is_contiguous()
    torch.testing.assert_close(out.double(), naive(q, k, v, mask, scale), rtol=1e-5, atol=1e-5)
    # the reference path agrees with the same explicit form
    torch.testing.assert_close(window_attention_ref(q, k, v, mask, scale).double(),
                               naive(q, k, v, mask, scale), rtol=1e-5, atol=1e-5)


@needs_ext
def test_large_scores_and_infinite_mask(ops_on):
    g = torch.Generator().manual_seed(1)
    q, k, v = (t * 30 for t in qkv_views(2, 49, 2, 16, g))  # scores of ±hundreds
    mask = torch.zeros(1, 1, 49, 49)
    mask[..., 10:] = float('-inf')  # every row keeps 10 keys
    out = window_attention(q, k, v, mask, 0.25)
    assert torch.isfinite(out).all()
    # outputs up to ~120: the float32 rounding of scores of ±hundreds costs torch's kernel the
    # same 9e-5 against float64
    torch.testing.assert_close(out.double(), naive(q, k, v, mask, 0.25), rtol=1e-5, atol=2e-4)


@needs_ext
def test_default_scale_and_contiguous_inputs(ops_on):
    g = torch.Generator().manual_seed(2)
    q, k, v = (t.contiguous() for t in qkv_views(3, 49, 4, 32, g))
    torch.testing.assert_close(window_attention(q, k, v).double(),
                               naive(q, k, v, None, 32 ** -0.5), rtol=1e-5, atol=1e-5)


@needs_ext
def test_results_do_not_depend_on_threads(ops_on):
    g = torch.Generator().manual_seed(3)
    q, k, v = qkv_views(7, 49, 3, 32, g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = window_attention(q, k, v)
        torch.set_num_threads(2)
        two = window_attention(q, k, v)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


class RecordOps(TorchDispatchMode):
    """The names of the aten operators that run (as a MAC counter would see them)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_falls_back_where_the_operator_does_not_apply():
    g = torch.Generator().manual_seed(4)
    q, k, v = qkv_views(2, 16, 2, 8, g)
    # a gradient is needed: autograd through the reference
    qg = q.detach().clone().requires_grad_()
    assert not window_attention_applies(qg, k, v)
    out = window_attention(qg, k, v)
    out.sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all()
    # float64 and the MAC counters (a dispatch mode) see the reference
    assert not window_attention_applies(q.double(), k.double(), v.double())
    with RecordOps() as record:
        assert not window_attention_applies(q, k, v)
        window_attention(q, k, v)
    assert any('scaled_dot_product' in name for name in record.names)
    torch.testing.assert_close(window_attention(q.double(), k.double(), v.double()),
                               naive(q, k, v, None, 8 ** -0.5))


def test_reference_when_ops_are_off(monkeypatch):
    monkeypatch.setenv('MMEFFVIT_OPS', '0')
    q, k, v = qkv_views(2, 16, 2, 8, torch.Generator().manual_seed(5))
    assert not window_attention_applies(q, k, v)
    torch.testing.assert_close(window_attention(q, k, v).double(),
                               naive(q, k, v, None, 8 ** -0.5), rtol=1e-5, atol=1e-5)


@needs_ext
def test_compiled_entry_point_checks_arguments():
    ext = ops.load_ext()
    q = torch.randn(2, 3, 16, 8)
    with pytest.raises(RuntimeError, match='float32'):
        ext.window_attention_forward(q.double(), q.double(), q.double(), None, 1.0)
    with pytest.raises(RuntimeError, match='one shape'):
        ext.window_attention_forward(q, q[:, :, :8], q, None, 1.0)
    with pytest.raises(RuntimeError, match='mask'):
        ext.window_attention_forward(q, q, q, torch.zeros(2, 3, 16, 8), 1.0)
    # a last dim that is not unit-stride is made contiguous, not misread
    qt = torch.randn(2, 3, 8, 16).transpose(-1, -2)
    torch.testing.assert_close(ext.window_attention_forward(qt, qt, qt, None, 0.5).double(),
                               naive(qt, qt, qt, None, 0.5), rtol=1e-5, atol=1e-5)


@needs_ext
@pytest.mark.parametrize('window_size', [7, None])
def test_window_msa_inference_matches_sdpa_path(monkeypatch, window_size):
    """WindowMSA in eval: the compiled operator against MMEFFVIT_OPS=0 (torch's attention),
    with the relative bias and a shift mask."""
    torch.manual_seed(0)
    attn = WindowMSA(64, 4, window_size=window_size).eval()
    if window_size is not None:
        torch.nn.init.normal_(attn.relative_position_bias_table, std=0.5)
    x = torch.randn(2 * 6, 49, 64)
    mask = torch.zeros(6, 49, 49).masked_fill(torch.rand(6, 49, 49) < 0.3, -100.)
    with torch.no_grad():
        monkeypatch.setenv('MMEFFVIT_OPS', '0')
        ref = attn(x, 7, mask)
        monkeypatch.setenv('MMEFFVIT_OPS', '1')
        out = attn(x, 7, mask)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
