"""mmeffvit.ops: compiled operators against their PyTorch references, gradcheck, errors, models."""
import importlib

import pytest
import torch
import torch.nn.functional as F

from mmeffvit import ops
from mmeffvit.models import FLattenPVT
from mmeffvit.ops.policy import ONEDNN_LINEAR, from_environment
from mmeffvit.ops import (depthwise_conv3x3_gelu, depthwise_conv3x3_gelu_ref, focus_feature_map,
                          focus_feature_map_ref, focused_linear_attention,
                          focused_linear_attention_ref, linear_attention, linear_attention_ref)

dw_ops = importlib.import_module('mmeffvit.ops.depthwise_conv')  # ops.depthwise_conv: the function

needs_ext = pytest.mark.skipif(ops.load_ext() is None, reason='mmeffvit._ext is not built')
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or ops.load_ext() is None
    or not ops.load_ext().compiled_with_cuda(), reason='needs a GPU and the CUDA build')


@pytest.fixture
def ops_on(monkeypatch, switch_kernels):
    switch_kernels()


@pytest.fixture(params=['brgemm', 'blas'])
def cpu_gemm(request):
    """Runs a test on the compiled kernels with their fp32 block products on each GEMM: the
    policy's (``use_kernels(cpu_gemm=...)``: oneDNN's linears go with brgemm, ATen's with BLAS)."""
    if request.param == 'brgemm' and not ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    with ops.use_kernels(cpu_gemm={'brgemm': 'onednn', 'blas': 'aten'}[request.param]):
        yield request.param


def naive_attention(q, k, v, normalizer='mean', eps=1e-6, tau=1.0, clamp_min=100.):
    """The explicit N×n form: o_i = τ Σ_j (q_i·k_j) v_j / normaliser_i (independent reference)."""
    a = q @ k.transpose(-2, -1)  # (B, h, N, n)
    n = k.shape[-2]
    if normalizer == 'mean':
        den = a.sum(-1, keepdim=True) / n + eps
        return tau * (a @ v) / n / den
    return tau * (a @ v) / a.sum(-1, keepdim=True).clamp(min=clamp_min)


def naive_focus(x, scale, p, eps=1e-6):
    """Per-token loop over the definition of eq. 5-6 (independent of both implementations)."""
    sp = torch.log1p(torch.exp(scale.double().reshape(-1)))
    out = torch.empty(x.shape, dtype=torch.float64)
    for idx, row in enumerate(x.double().reshape(-1, x.shape[-1])):
        t = (row.clamp(min=0) + eps) / sp
        u = t ** p
        out.view(-1, x.shape[-1])[idx] = u * t.square().sum().sqrt() / u.square().sum().sqrt()
    return out


# ---------------------------------------------------------------- focus_feature_map
@needs_ext
@pytest.mark.parametrize('p', [3, 2.5])
def test_focus_matches_naive_and_reference(ops_on, p):
    x = torch.randn(2, 7, 37)
    scale = torch.randn(1, 1, 37)
    out = focus_feature_map(x, scale, p)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), naive_focus(x, scale, p), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, focus_feature_map_ref(x, scale, p), rtol=1e-5, atol=1e-6)


@needs_ext
@pytest.mark.parametrize('p', [3, 1.7])
def test_focus_gradcheck_float64(ops_on, p):
    x = torch.randn(3, 5, 13, dtype=torch.float64)
    x[0, 0, :4] = -1.0  # ReLU-dead entries
    scale = torch.randn(13, dtype=torch.float64).mul(3).requires_grad_()
    scale.data[0] = 25.  # the softplus linear branch
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, s: focus_feature_map(a, s, p), (x, scale))


@needs_ext
@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-5), (torch.bfloat16, 1e-5)])
def test_focus_dtypes_and_grads_against_reference(ops_on, dtype, tol):
    x = torch.randn(4, 33, 24).to(dtype)
    scale = torch.randn(1, 1, 24)
    xa, sa = x.clone().requires_grad_(), scale.clone().requires_grad_()
    xb, sb = x.clone().requires_grad_(), scale.clone().requires_grad_()
    ya = focus_feature_map(xa, sa)
    with torch.no_grad():  # the reference in fp32 from the same (rounded) inputs
        yb_val = focus_feature_map_ref(x.float(), scale)
    torch.testing.assert_close(ya, yb_val, rtol=tol, atol=tol)
    g = torch.randn_like(ya)
    ya.backward(g)
    focus_feature_map_ref(xb.float(), sb).backward(g)
    assert xa.grad.dtype == dtype
    torch.testing.assert_close(xa.grad.float(), xb.grad.float(),
                               rtol=1e-2 if dtype == torch.bfloat16 else 1e-4, atol=1e-4)
    torch.testing.assert_close(sa.grad, sb.grad, rtol=1e-4, atol=1e-4)


@needs_ext
def test_focus_non_contiguous_and_one_token(ops_on):
    base = torch.randn(3, 24, 10)
    x = base.transpose(1, 2)  # (3, 10, 24), non-contiguous
    scale = torch.randn(24)
    torch.testing.assert_close(focus_feature_map(x, scale), focus_feature_map_ref(x, scale))
    one = torch.randn(1, 1, 5)
    torch.testing.assert_close(focus_feature_map(one, scale[:5]),
                               focus_feature_map_ref(one, scale[:5]))


def test_focus_bad_inputs():
    with pytest.raises(ValueError, match='channels'):
        focus_feature_map(torch.randn(2, 8), torch.zeros(7))
    with pytest.raises(TypeError, match='floating'):
        focus_feature_map(torch.ones(2, 8, dtype=torch.long), torch.zeros(8))


# ---------------------------------------------------------------- linear_attention
def qkv(B=2, h=3, N=11, n=7, d=5, e=6, dtype=torch.float64, positive=True):
    g = torch.Generator().manual_seed(0)
    f = (lambda t: t.abs()) if positive else (lambda t: t)
    return (f(torch.randn(B, h, N, d, generator=g)).to(dtype),
            f(torch.randn(B, h, n, d, generator=g)).to(dtype),
            torch.randn(B, h, n, e, generator=g).to(dtype))


@needs_ext
@pytest.mark.parametrize('normalizer', ['mean', 'sum'])
def test_attention_matches_naive(ops_on, normalizer):
    q, k, v = qkv()
    clamp = 2.0  # some rows above, some below the clamp
    out = linear_attention(q, k, v, normalizer, clamp_min=clamp)
    torch.testing.assert_close(out, naive_attention(q, k, v, normalizer, clamp_min=clamp))
    torch.testing.assert_close(out, linear_attention_ref(q, k, v, normalizer, clamp_min=clamp))


@needs_ext
@pytest.mark.parametrize('normalizer,identity', [('mean', False), ('sum', False), ('sum', True)])
def test_attention_gradcheck_float64(ops_on, normalizer, identity):
    q, k, v = qkv(N=9, n=6, d=3, e=3 if identity else 4)
    tau = torch.rand(3, 1, 1, dtype=torch.float64) + 0.5 if normalizer == 'sum' else None
    args = [t.requires_grad_() for t in (q, k, v)]
    if tau is not None:
        args.append(tau.requires_grad_())

    def fn(q, k, v, tau=None):
        return linear_attention(q, k, None if identity else v, normalizer, temperature=tau,
                                clamp_min=2.0)
    assert torch.autograd.gradcheck(fn, tuple(args))


@needs_ext
def test_attention_temperature_and_identity_values_against_reference(ops_on):
    q, k, v = qkv(N=13, n=13, d=4, e=4, dtype=torch.float32)
    tau = (torch.rand(3, 1, 1) + 0.5).requires_grad_()
    tau_ref = tau.detach().clone().requires_grad_()
    out = linear_attention(q, k, None, 'sum', temperature=tau, clamp_min=3.0)
    ref = linear_attention_ref(q, k, None, 'sum', temperature=tau_ref, clamp_min=3.0)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(out, naive_attention(q, k, k, 'sum', tau=tau_ref.view(1, 3, 1, 1),
                                                    clamp_min=3.0))
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(tau.grad, tau_ref.grad)
    torch.testing.assert_close(linear_attention(q, k, v, 'mean', temperature=2.0),
                               2.0 * linear_attention_ref(q, k, v, 'mean'))


@needs_ext
@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_attention_dtypes_long_sequences(ops_on, cpu_gemm, dtype, tol):
    # more rows than one 512-row block; d not a power of two
    q, k, v = qkv(B=1, h=2, N=1100, n=700, d=24, e=24, dtype=torch.float32)
    qa, ka, va = (t.to(dtype).requires_grad_() for t in (q, k, v))
    out = linear_attention(qa, ka, va)
    assert out.dtype == dtype
    qr, kr, vr = (t.to(dtype).float().requires_grad_() for t in (q, k, v))
    ref = linear_attention_ref(qr, kr, vr)
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
    g = torch.randn_like(ref)
    out.backward(g.to(dtype))
    ref.backward(g)
    for a, b in ((qa, qr), (ka, kr), (va, vr)):
        scale = b.grad.abs().max()
        torch.testing.assert_close(a.grad.float() / scale, b.grad / scale, rtol=tol, atol=tol)


@needs_ext
def test_attention_non_contiguous_and_single_token(ops_on):
    # heads split from (B, N, h*d) tokens: the layout the model passes (strided rows)
    B, N, h, d = 2, 10, 2, 6
    tok = torch.rand(B, N, h * d, dtype=torch.float64)
    q = tok.reshape(B, N, h, d).transpose(1, 2)
    v = torch.randn(B, N, h * d, dtype=torch.float64).reshape(B, N, h, d).transpose(1, 2)
    assert not q.is_contiguous()
    torch.testing.assert_close(linear_attention(q, q, v), linear_attention_ref(q, q, v))
    q1, k1, v1 = qkv(N=1, n=1)
    torch.testing.assert_close(linear_attention(q1, k1, v1), naive_attention(q1, k1, v1))
    tq = q.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a: linear_attention(a, q, v), (tq,))


@needs_ext
def test_ops_under_bf16_autocast_keep_fp32_inside(ops_on):
    q, k, v = qkv(N=600, n=600, d=8, e=8, dtype=torch.float32)
    x = torch.randn(600, 8, requires_grad=True)
    scale = torch.randn(8)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = linear_attention(q.requires_grad_(), k, v)
        y = focus_feature_map(x, scale)
    assert out.dtype == y.dtype == torch.float32
    torch.testing.assert_close(out, linear_attention_ref(q, k, v))
    (out.sum() + y.sum()).backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(x.grad).all()


def test_attention_bad_inputs(monkeypatch):
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(ValueError, match='shape mismatch'):
        linear_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match='4-D'):
        linear_attention(q[0], k, v)
    with pytest.raises(TypeError, match='dtype'):
        linear_attention(q, k.double(), v)
    with pytest.raises(ValueError, match='normalizer'):
        linear_attention(q, k, v, 'softmax')
    with pytest.raises(ValueError, match='temperature'):
        linear_attention(q, k, v, 'sum', temperature=torch.ones(5))


@needs_ext
def test_compiled_entry_points_check_arguments():
    ext = ops.load_ext()
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(RuntimeError, match='same dtype'):
        ext.linear_attention_forward(q, k.double(), v, None, 0, 1e-6, 100.)
    with pytest.raises(RuntimeError, match='mode'):
        ext.linear_attention_forward(q, k, v, None, 3, 1e-6, 100.)
    with pytest.raises(RuntimeError, match='scale must have'):
        ext.focus_forward(torch.randn(4, 8), torch.zeros(3), 3.0, 1e-6)
    with pytest.raises(RuntimeError, match='floating'):
        ext.focus_forward(torch.ones(4, 8, dtype=torch.int32), torch.zeros(8), 3.0, 1e-6)
    if not ext.compiled_with_cuda():
        meta = torch.empty(4, 8, device='meta')
        with pytest.raises(RuntimeError, match='CPU or CUDA'):
            ext.focus_forward(meta, torch.zeros(8, device='meta'), 3.0, 1e-6)


@needs_ext
def test_compiled_backward_entry_points_check_every_argument():
    """Every tensor a backward reads is checked before any kernel runs: the state of another
    call (shape), device or accumulation type, and a gradient of the wrong shape or device
    are errors, not out-of-bounds reads (what a CUDA kernel would make of them)."""
    ext = ops.load_ext()
    q, k, v = qkv(dtype=torch.float32)
    out, kv, ksum = ext.linear_attention_forward(q, k, v, None, 0, 1e-6, 100.)
    g = torch.randn_like(out)
    meta = torch.empty(1, device='meta')
    bad = [((g, q, k, v, kv[:, :, :-1], ksum), 'kv must have shape'),
           ((g, q, k, v, kv, ksum[..., :-1]), 'ksum must have shape'),
           ((g, q, k, v, kv.double(), ksum), 'accumulation type'),
           ((g, q, k, v, kv, meta.expand(ksum.shape)), 'ksum must be a tensor on'),
           ((g[..., :-1], q, k, v, kv, ksum), 'grad must have shape'),
           ((meta.expand(g.shape), q, k, v, kv, ksum), 'grad must be on'),
           ((g.int(), q, k, v, kv, ksum), 'floating')]
    for args, message in bad:
        with pytest.raises(RuntimeError, match=message):
            ext.linear_attention_backward(*args, None, 0, 1e-6, 100.)
    with pytest.raises(RuntimeError, match='mode'):
        ext.linear_attention_backward(g, q, k, v, kv, ksum, None, 2, 1e-6, 100.)
    # the state is read dense whatever its strides
    grads = ext.linear_attention_backward(g, q, k, v, kv.transpose(-2, -1).contiguous()
                                          .transpose(-2, -1), ksum, None, 0, 1e-6, 100.)
    for a, b in zip(grads, ext.linear_attention_backward(g, q, k, v, kv, ksum, None, 0, 1e-6,
                                                         100.)):
        if a is not None:
            torch.testing.assert_close(a, b)

    x, scale = torch.randn(4, 8), torch.zeros(8)
    gy = torch.randn(4, 8)
    for args, message in [((gy[:, :-1], x, scale), 'grad must have shape'),
                          ((meta.expand(4, 8), x, scale), 'grad must be on'),
                          ((gy, x.int(), scale), 'floating'),
                          ((gy, x, scale[:-1]), 'scale must have'),
                          ((gy, x, meta.expand(8)), 'same device'),
                          ((gy.flatten(), x.flatten(), scale), 'rows, C')]:
        with pytest.raises(RuntimeError, match=message):
            ext.focus_backward(*args, 3.0, 1e-6)

    qt, kt, vt = (t.transpose(1, 2).flatten(2) for t in qkv(dtype=torch.float32, e=5))
    scale = torch.zeros(15)
    out, kv, ksum = ext.focused_linear_attention_forward(qt, kt, vt, scale, 3, 3.0, 1e-6, 1e-6)
    grad = torch.randn_like(out)
    backward = ext.focused_linear_attention_backward
    with pytest.raises(RuntimeError, match='kv must have shape'):
        backward(grad, qt, kt, vt, scale, kv[:, :1], ksum, 3, 3.0, 1e-6, 1e-6)
    with pytest.raises(RuntimeError, match='ksum must have shape'):
        backward(grad, qt, kt, vt, scale, kv, ksum[:, :, :1], 3, 3.0, 1e-6, 1e-6)


def test_ops_switch(switch_kernels):
    with pytest.raises(ValueError, match='MMEFFVIT_OPS'):
        from_environment({'MMEFFVIT_OPS': '2'})
    switch_kernels.reference()
    assert ops.ops_mode() == '0' and ops.get_ext(torch.zeros(1)) is None
    switch_kernels()
    assert ops.ops_mode() == '1'
    if ops.load_ext() is None:
        with pytest.raises(RuntimeError, match='not built'):
            ops.get_ext(torch.zeros(1))
    else:
        assert ops.get_ext(torch.zeros(1)) is ops.load_ext()


# ---------------------------------------------------------------- focused_linear_attention
def naive_focused(q, k, v, scale, heads, p=3, eps=1e-6):
    """eq. 5-7 spelled out: per-token focusing, head split, explicit N×n attention, merge."""
    b, n_q, c = q.shape

    def split(t):
        return t.reshape(b, t.shape[1], heads, -1).transpose(1, 2)
    out = naive_attention(split(naive_focus(q, scale, p)), split(naive_focus(k, scale, p)),
                          split(v.double()), eps=eps)
    return out.transpose(1, 2).reshape(b, n_q, -1)


def fla_inputs(B=2, N=11, n=7, C=12, Ce=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, m, C, generator=g).to(dtype) for m in (N, n))
    v = torch.randn(B, n, Ce or C, generator=g).to(dtype)
    scale = torch.randn(1, 1, C, generator=g).to(dtype)
    return q, k, v, scale


@needs_ext
@pytest.mark.parametrize('shape', [(2, 11, 7, 12, 3), (1, 700, 600, 8, 2), (9, 5, 5, 6, 1)])
def test_focused_matches_naive(ops_on, shape):
    # (1, 700, 600): one batch of several row blocks (per-thread partial sums);
    # (9, 5, 5): more batches than threads (each batch reduced by one thread)
    B, N, n, C, h = shape
    q, k, v, scale = fla_inputs(B, N, n, C)
    out = focused_linear_attention(q, k, v, scale, h)
    torch.testing.assert_close(out, naive_focused(q, k, v, scale, h), rtol=1e-9, atol=1e-12)


@needs_ext
@pytest.mark.parametrize('p', [3, 2.5])
def test_focused_gradcheck_float64(ops_on, p):
    q, k, v, scale = fla_inputs(2, 6, 5, 6, Ce=4)
    q[0, 0, :3] = -1.0  # ReLU-dead entries
    scale[..., 0] = 25.  # the softplus linear branch
    args = [t.requires_grad_() for t in (q, k, v, scale)]
    assert torch.autograd.gradcheck(
        lambda a, b, c, d: focused_linear_attention(a, b, c, d, 2, p), args)


@needs_ext
@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_focused_dtypes_against_reference(ops_on, cpu_gemm, dtype, tol):
    q, k, v, scale = fla_inputs(1, 600, 600, 32, dtype=dtype, seed=1)
    scale = scale.float()
    ins = [t.requires_grad_() for t in (q, k, v, scale)]
    out = focused_linear_attention(*ins, 4)
    assert out.dtype == dtype
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, ins, g)
    ref = focused_linear_attention_ref(*ins, 4)
    ref_grads = torch.autograd.grad(ref, ins, g)
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    for a, b in zip(grads, ref_grads):
        assert a.dtype == b.dtype
        err = (a.float() - b.float()).abs().max() / b.float().abs().max()
        assert err < tol * 10, err


@needs_ext
def test_focused_non_contiguous_single_token_and_mixed_dtypes(ops_on):
    # q, k, v as chunks of one fused qkv projection (row stride 3C), as FLatten-Swin passes them
    qkv = torch.randn(3, 1, 8 * 3, dtype=torch.float64)
    q, k, v = qkv.chunk(3, dim=-1)
    scale = torch.randn(8, dtype=torch.float64)
    torch.testing.assert_close(focused_linear_attention(q, k, v, scale, 2),
                               naive_focused(q, k, v, scale, 2), rtol=1e-9, atol=1e-12)
    # bf16 queries with fp32 keys (a positional encoding added under autocast): q's dtype out
    q32, k32, v32, s32 = fla_inputs(1, 9, 9, 8, dtype=torch.float32)
    out = focused_linear_attention(q32.bfloat16(), k32, v32, s32, 2)
    assert out.dtype == torch.bfloat16
    ref = focused_linear_attention_ref(q32.bfloat16().float(), k32, v32, s32, 2)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)


def test_focused_bad_inputs():
    q, k, v, scale = fla_inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match='shape mismatch'):
        focused_linear_attention(q, k[..., :6], v, scale, 3)
    with pytest.raises(ValueError, match='divisible'):
        focused_linear_attention(q, k, v, scale, 5)
    with pytest.raises(ValueError, match='scale has'):
        focused_linear_attention(q, k, v, scale[..., :4], 3)
    with pytest.raises(ValueError, match='floating'):
        focused_linear_attention(q.long(), k, v, scale, 3)


@needs_ext
def test_focused_compiled_entry_points_check_arguments():
    ext = ops.load_ext()
    q, k, v, scale = fla_inputs(dtype=torch.float32)
    with pytest.raises(RuntimeError, match='divisible'):
        ext.focused_linear_attention_forward(q, k, v, scale, 5, 3.0, 1e-6, 1e-6)
    with pytest.raises(RuntimeError, match='same dtype'):
        ext.focused_linear_attention_forward(q, k.double(), v, scale, 3, 3.0, 1e-6, 1e-6)
    with pytest.raises(RuntimeError, match='at least one key'):
        ext.focused_linear_attention_forward(q, k[:, :0], v[:, :0], scale, 3, 3.0, 1e-6, 1e-6)
    with pytest.raises(RuntimeError, match='grad must be'):
        ext.focused_linear_attention_backward(q[..., :6], q, k, v, scale, torch.zeros(2, 3, 4, 4),
                                              torch.zeros(2, 3, 4), 3, 3.0, 1e-6, 1e-6)


@needs_ext
def test_cpu_gemm_choice():
    ext = ops.load_ext()
    before = ext.set_cpu_gemm('auto')
    try:
        avx512 = torch.backends.cpu.get_cpu_capability().startswith('AVX512')
        assert ext.set_cpu_gemm('blas') == ('brgemm' if avx512 else 'blas')
        assert ext.set_cpu_gemm('auto') == 'blas'
        with pytest.raises(RuntimeError, match="'brgemm', 'blas' or 'auto'"):
            ext.set_cpu_gemm('mkl')
    finally:
        ext.set_cpu_gemm(before)


@needs_ext
def test_focused_brgemm_and_blas_agree_with_strided_heads_and_a_partial_block(ops_on):
    # the model's layout: k and v halves of one kv projection, 2 heads of 64; 304 rows = one
    # full 256-row block and a partial one of 48 (a second brgemm kernel; a ragged one would
    # stay on BLAS); a transposed operand in the state product and in both backward products
    ext = ops.load_ext()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 304, 128, generator=g)
    kv = torch.randn(2, 304, 256, generator=g)
    k, v = kv.chunk(2, -1)
    scale = torch.randn(128, generator=g) * 0.1
    grad = torch.randn(2, 304, 128, generator=g)
    ref = focused_linear_attention_ref(q.double(), k.double(), v.double(), scale.double(), 2)
    before = ext.set_cpu_gemm('auto')
    try:
        results = {}
        for name in ('brgemm', 'blas'):
            ext.set_cpu_gemm(name)
            out, kv_state, ksum = ext.focused_linear_attention_forward(q, k, v, scale, 2, 3.0,
                                                                       1e-6, 1e-6)
            results[name] = [out] + ext.focused_linear_attention_backward(
                grad, q, k, v, scale, kv_state, ksum, 2, 3.0, 1e-6, 1e-6)
    finally:
        ext.set_cpu_gemm(before)
    torch.testing.assert_close(results['brgemm'][0].double(), ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(results['brgemm'], results['blas']):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * b.abs().max().item())


# ---------------------------------------------------------------- depthwise conv 3x3 + GELU
def conv3x3_gelu_float64(x, weight, bias, hw_shape):
    """Independent reference: zero-padded 3×3 taps summed by hand in float64, then exact GELU."""
    b, _, c = x.shape
    h, w = hw_shape
    pad = F.pad(x.double().reshape(b, h, w, c), (0, 0, 1, 1, 1, 1))
    out = sum(pad[:, i:i + h, j:j + w] * weight.double()[:, 0, i, j]
              for i in range(3) for j in range(3))
    if bias is not None:
        out = out + bias.double()
    return F.gelu(out).reshape(b, h * w, c)


@needs_ext
@pytest.mark.parametrize('vectorized', [True, False])
@pytest.mark.parametrize('shape,bias', [((2, 5, 7, 20), True), ((1, 1, 1, 16), True),
                                        ((1, 1, 9, 33), False), ((1, 9, 1, 48), True),
                                        ((2, 3, 2, 64), True), ((1, 6, 5, 1), True)])
def test_depthwise_conv3x3_gelu_matches_float64_taps(vectorized, shape, bias):
    # channels not a multiple of 16 (masked vectors), single rows / columns (edge columns only)
    b, h, w, c = shape
    g = torch.Generator().manual_seed(sum(shape))
    x = 2 * torch.randn(b, h * w, c, generator=g)
    weight = torch.randn(c, 1, 3, 3, generator=g)
    bias = torch.randn(c, generator=g) if bias else None
    out = ops.load_ext().depthwise_conv3x3_gelu(x, weight, bias, h, w, vectorized)
    assert out.shape == x.shape and out.is_contiguous()
    torch.testing.assert_close(out.double(), conv3x3_gelu_float64(x, weight, bias, (h, w)),
                               rtol=1e-6, atol=4e-6)


@needs_ext
def test_depthwise_conv3x3_gelu_large_map_with_non_temporal_stores():
    # over 32 MiB of output: the streaming stores; the wrapper takes the compiled pass
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64 * 130, 1024, generator=g)
    weight = torch.randn(1024, 1, 3, 3, generator=g) * 0.3
    bias = torch.randn(1024, generator=g) * 0.1
    with torch.no_grad():
        assert dw_ops.compiled_conv3x3_gelu_applies(x)
        out = depthwise_conv3x3_gelu(x, weight, bias, (64, 130))
    torch.testing.assert_close(out.double(), conv3x3_gelu_float64(x, weight, bias, (64, 130)),
                               rtol=1e-6, atol=4e-6)


def test_depthwise_conv3x3_gelu_reference_path_where_the_pass_does_not_apply(monkeypatch,
                                                                             switch_kernels):
    # small maps, gradients or MMEFFVIT_OPS=0: F.conv2d + F.gelu, differentiable
    x = torch.randn(2, 4 * 5, 8, requires_grad=True)
    weight, bias = torch.randn(8, 1, 3, 3), torch.randn(8)
    assert not dw_ops.compiled_conv3x3_gelu_applies(x)
    out = depthwise_conv3x3_gelu(x, weight, bias, (4, 5))
    assert out.requires_grad
    torch.testing.assert_close(out, depthwise_conv3x3_gelu_ref(x, weight, bias, (4, 5)))
    torch.testing.assert_close(out.double(), conv3x3_gelu_float64(x, weight, bias, (4, 5)),
                               rtol=1e-6, atol=4e-6)
    switch_kernels.reference()
    monkeypatch.setattr(dw_ops, 'COMPILED_CONV3X3_GELU_MIN_ELEMENTS', 0)
    with torch.no_grad():
        assert not dw_ops.compiled_conv3x3_gelu_applies(x)


@needs_ext
def test_depthwise_conv3x3_gelu_checks_arguments():
    ext = ops.load_ext()
    x, weight = torch.randn(1, 12, 8), torch.randn(8, 1, 3, 3)
    with pytest.raises(RuntimeError, match='do not form the grid'):
        ext.depthwise_conv3x3_gelu(x, weight, None, 3, 5)
    with pytest.raises(RuntimeError, match='float32 CPU tokens'):
        ext.depthwise_conv3x3_gelu(x.double(), weight, None, 3, 4)
    with pytest.raises(RuntimeError, match=r'weight must be float32 \(8, 1, 3, 3\)'):
        ext.depthwise_conv3x3_gelu(x, torch.randn(8, 1, 5, 5), None, 3, 4)
    with pytest.raises(RuntimeError, match='bias must be float32 with 8 elements'):
        ext.depthwise_conv3x3_gelu(x, weight, torch.randn(7), 3, 4)


# ---------------------------------------------------------------- models, ops on vs off
@needs_ext
def test_flatten_pvt_same_outputs_and_grads_with_ops_on_and_off(switch_kernels):
    torch.manual_seed(0)
    model = FLattenPVT('tiny').eval()  # eval: no stochastic depth, gradients still flow
    for name, p in model.named_parameters():  # non-trivial focusing scales
        if name.endswith('.scale'):
            p.data.normal_()
    x = torch.rand(1, 3, 75, 99)
    results = {}
    for flag in ('0', '1'):
        switch_kernels() if flag == '1' else switch_kernels.reference()
        model.zero_grad()
        outs = model(x)
        sum(o.square().mean() for o in outs).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[flag] = ([o.detach() for o in outs], grads)
    for a, b in zip(results['0'][0], results['1'][0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert results['0'][1].keys() == results['1'][1].keys()
    for name, g in results['0'][1].items():
        torch.testing.assert_close(results['1'][1][name], g, rtol=1e-3, atol=1e-5, msg=name)


# ---------------------------------------------------------------- CUDA
@needs_cuda
@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_cuda_matches_cpu_reference(ops_on, dtype, tol):
    x = torch.randn(3, 300, 64)
    scale = torch.randn(64)
    xc = x.cuda().to(dtype).requires_grad_()
    sc = scale.cuda().requires_grad_()
    y = focus_feature_map(xc, sc)
    xr = x.to(dtype).float().requires_grad_()
    sr = scale.clone().requires_grad_()
    yr = focus_feature_map_ref(xr, sr)
    torch.testing.assert_close(y.cpu(), yr, rtol=tol, atol=tol)
    g = torch.randn_like(yr)
    y.backward(g.cuda())
    yr.backward(g)
    torch.testing.assert_close(sc.grad.cpu(), sr.grad, rtol=1e-3, atol=1e-3)
    q, k, v = qkv(B=2, h=2, N=700, n=300, d=32, e=32, dtype=torch.float32)
    tau = torch.rand(2) + 0.5
    for normalizer in ('mean', 'sum'):
        args = [t.cuda().to(dtype).requires_grad_() for t in (q, k, v)]
        tc = tau.cuda().requires_grad_()
        out = linear_attention(*args, normalizer, temperature=tc, clamp_min=5.0)
        refs = [t.to(dtype).float().requires_grad_() for t in (q, k, v)]
        tr = tau.clone().requires_grad_()
        ref = linear_attention_ref(*refs, normalizer, temperature=tr, clamp_min=5.0)
        torch.testing.assert_close(out.float().cpu(), ref, rtol=tol, atol=tol)
        g = torch.randn_like(ref)
        out.backward(g.cuda().to(dtype))
        ref.backward(g)
        for a, b in zip(args + [tc], refs + [tr]):
            s = b.grad.abs().max()
            torch.testing.assert_close(a.grad.float().cpu() / s, b.grad / s, rtol=tol, atol=tol)


@needs_cuda
def test_cuda_gradcheck_float64(ops_on):
    q, k, v = (t.cuda().requires_grad_() for t in qkv(N=9, n=6, d=3, e=4))
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention(a, b, c), (q, k, v))
    x = torch.randn(4, 9, dtype=torch.float64, device='cuda', requires_grad=True)
    s = torch.randn(9, dtype=torch.float64, device='cuda', requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: focus_feature_map(a, b), (x, s))


@needs_cuda
def test_cuda_model_ops_on_off(switch_kernels):
    model = FLattenPVT('tiny').cuda().eval()
    x = torch.rand(1, 3, 96, 128, device='cuda')
    outs = {}
    for flag in ('0', '1'):
        switch_kernels() if flag == '1' else switch_kernels.reference()
        with torch.no_grad():
            outs[flag] = model(x)
    for a, b in zip(outs['0'], outs['1']):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
