"""FocusedLinearAttention against an independent, explicit N×N computation."""
import importlib

import pytest
import torch
import torch.nn.functional as F

from mmeffvit.models.layers import FocusedLinearAttention
from mmeffvit.ops import load_ext

qkv_ops = importlib.import_module('mmeffvit.ops.focused_qkv_attention')  # shadowed in ops


def naive_flatten(attn, x, hw):
    """FLatten attention written out token by token from the paper's definitions (float64)."""
    b, n, c = x.shape
    h, d = attn.num_heads, attn.head_dims
    if attn.qkv_layout == 'qkv':
        q, k, v = attn.qkv(x).chunk(3, -1)
    else:
        q = attn.q(x)
        k, v = attn.kv(x).chunk(2, -1)
    if attn.positional_encoding is not None:
        pe = attn.positional_encoding
        if tuple(hw) != attn.pe_size:
            grid = pe.reshape(1, *attn.pe_size, c).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=hw, mode='bicubic', align_corners=False)
            pe = grid.permute(0, 2, 3, 1).reshape(1, -1, c)
        k = k + pe
    s = torch.log1p(torch.exp(attn.scale))  # softplus by its definition
    p = attn.focusing_factor

    def phi(t):
        t = torch.clamp(t, min=0) + 1e-6
        t = t / s
        tp = t ** p
        norm_t = torch.sqrt((t * t).sum(-1, keepdim=True))
        return tp / torch.sqrt((tp * tp).sum(-1, keepdim=True)) * norm_t

    qf, kf = phi(q), phi(k)
    out = torch.zeros_like(q)
    for head in range(h):
        sl = slice(head * d, (head + 1) * d)
        sim = qf[..., sl] @ kf[..., sl].transpose(-1, -2)          # explicit (B, N, n)
        num = sim @ v[..., sl]
        den = sim.sum(-1, keepdim=True) + n * 1e-6                   # = n * (q·mean(k) + 1e-6)
        out[..., sl] = num / den
    # depthwise conv per head, the same kernels for every head, written as explicit sums
    w, bias = attn.dwc.weight[:, 0], attn.dwc.bias                  # (d, K, K)
    ks = w.shape[-1]
    r = ks // 2
    vg = v.reshape(b, hw[0], hw[1], c)
    vp = F.pad(vg.permute(0, 3, 1, 2), (r, r, r, r)).permute(0, 2, 3, 1)
    dwc = torch.zeros_like(vg)
    wc = w.repeat(h, 1, 1)  # channel head*d+j uses kernel j
    for dy in range(ks):
        for dx in range(ks):
            dwc += vp[:, dy:dy + hw[0], dx:dx + hw[1], :] * wc[:, dy, dx]
    dwc = dwc + bias.repeat(h)
    out = out + dwc.reshape(b, n, c)
    return attn.proj(out)


def make_attn(layout='q_kv', pe=(4, 5), heads=2, dims=12, kernel=3):
    torch.manual_seed(0)
    attn = FocusedLinearAttention(dims, heads, pe_size=pe, qkv_layout=layout, kernel_size=kernel)
    with torch.no_grad():  # non-trivial values for the zero-initialised parameters
        attn.scale.normal_(0, 0.5)
        if attn.positional_encoding is not None:
            attn.positional_encoding.normal_(0, 0.5)
    return attn.double()


@pytest.mark.parametrize('layout', ['q_kv', 'qkv'])
@pytest.mark.parametrize('hw', [(4, 5), (3, 7)])  # stored grid, and a resized one
def test_forward_matches_naive(layout, hw):
    attn = make_attn(layout)
    x = torch.randn(2, hw[0] * hw[1], 12, dtype=torch.float64)
    ours = attn(x, hw)
    ref = naive_flatten(attn, x, hw)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-9)


def test_gradients_match_naive():
    attn = make_attn()
    hw = (4, 5)
    x = torch.randn(2, 20, 12, dtype=torch.float64, requires_grad=True)
    ours = attn(x, hw)
    g = torch.randn_like(ours)
    grads = torch.autograd.grad((ours * g).sum(), [x] + list(attn.parameters()))
    ref = naive_flatten(attn, x, hw)
    ref_grads = torch.autograd.grad((ref * g).sum(), [x] + list(attn.parameters()))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_gradcheck_small():
    attn = make_attn(pe=None, heads=1, dims=4)
    x = torch.randn(1, 6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: attn(t, (2, 3)), (x, ))


def test_focusing_is_global_over_heads():
    """Per-head normalisation would change the output: the norm must span all channels."""
    attn = make_attn(pe=None)
    x = torch.randn(1, 20, 12, dtype=torch.float64)
    out = attn(x, (4, 5))
    ref = naive_flatten(attn, x, (4, 5))
    torch.testing.assert_close(out, ref)


def test_spatial_reduction_runs_and_shapes():
    attn = FocusedLinearAttention(16, 2, pe_size=(3, 4), sr_ratio=2)
    out = attn(torch.randn(2, 7 * 9, 16), (7, 9))
    assert out.shape == (2, 63, 16)


def test_autocast_keeps_focus_in_fp32_and_finite():
    attn = FocusedLinearAttention(32, 2, pe_size=(8, 8))
    x = torch.randn(2, 64, 32) * 50  # large activations: t**3 would overflow in half precision
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = attn(x, (8, 8))
    assert out.dtype == torch.bfloat16
    assert torch.isfinite(out.float()).all()
    ref = attn(x, (8, 8))
    rel = (out.float() - ref).norm() / ref.norm()
    assert rel < 0.02, rel


def test_errors_are_clear():
    with pytest.raises(ValueError, match='divisible'):
        FocusedLinearAttention(10, 3)
    attn = FocusedLinearAttention(8, 2)
    with pytest.raises(ValueError, match='hw_shape'):
        attn(torch.randn(1, 10, 8), (3, 4))


def test_attend_without_projections_matches_full_module():
    """qkv_layout=None (CSWin style): same math when the caller projects q, k, v itself."""
    full = make_attn('qkv')
    bare = FocusedLinearAttention(12, 2, pe_size=(4, 5), qkv_layout=None, kernel_size=3).double()
    bare.load_state_dict({k: v for k, v in full.state_dict().items()
                          if not k.startswith(('qkv', 'proj'))})
    assert not hasattr(bare, 'proj') and not hasattr(bare, 'qkv')
    x = torch.randn(2, 20, 12, dtype=torch.float64)
    q, k, v = full.qkv(x).chunk(3, -1)
    torch.testing.assert_close(full.proj(bare.attend(q, k, v, (4, 5))), full(x, (4, 5)))
    with pytest.raises(RuntimeError, match='attend'):
        bare(x, (4, 5))


def _fused_case(dtype, batch, with_pe):
    torch.manual_seed(0)
    attn = FocusedLinearAttention(24, 3, pe_size=(4, 5) if with_pe else None, qkv_layout='qkv')
    with torch.no_grad():  # non-zero scale, encoding and DWC so every gradient is informative
        attn.scale.uniform_(-1, 1)
        if with_pe:
            attn.positional_encoding.normal_(0, 0.5)
        attn.dwc.bias.uniform_(-0.5, 0.5)
    attn = attn.to(dtype)
    x = torch.randn(batch, 6 * 7, 24, dtype=dtype, requires_grad=True)
    return attn, x


def _run(attn, x, grad, retain=False):
    out = attn(x, (6, 7))
    tensors = [x] + [p for p in attn.parameters()]
    return out, torch.autograd.grad(out, tensors, grad, retain_graph=retain)


def _count(monkeypatch, owner, name):
    """Calls of ``owner.name`` from now on (the fused paths of ops.focused_qkv_attention)."""
    calls = []
    original = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *args: calls.append(1) or original(*args))
    return calls


@pytest.mark.skipif(load_ext() is None, reason='mmeffvit._ext not built')
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('batch,with_pe', [(1, True), (2, True), (2, False)])
def test_fused_qkv_training_path_matches_the_pytorch_reference(dtype, batch, with_pe,
                                                               monkeypatch, switch_kernels):
    attn, x = _fused_case(dtype, batch, with_pe)
    grad = torch.randn(batch, 42, 24, dtype=dtype)
    calls = _count(monkeypatch, qkv_ops._QKVFocusedAttention, 'apply')
    switch_kernels.reference()  # the reference: PyTorch FLA, torch's conv
    ref_out, ref_grads = _run(attn, x, grad)
    assert not calls
    switch_kernels()
    out, grads = _run(attn, x, grad)
    assert len(calls) == (dtype == torch.float32)  # oneDNN's path: fp32 only
    tol = dict(rtol=2e-4, atol=2e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(out, ref_out, **tol)
    names = ['x'] + [n for n, _ in attn.named_parameters()]
    for name, got, expected in zip(names, grads, ref_grads):
        torch.testing.assert_close(got, expected, **tol, msg=lambda m, n=name: f'{n}: {m}')


@pytest.mark.skipif(load_ext() is None, reason='mmeffvit._ext not built')
def test_fused_qkv_path_keeps_its_saved_projection_when_the_graph_is_retained(switch_kernels):
    switch_kernels()
    attn, x = _fused_case(torch.float32, 1, True)
    grad = torch.randn(1, 42, 24)
    out, first = _run(attn, x, grad, retain=True)
    second = torch.autograd.grad(out, [x] + list(attn.parameters()), grad)
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(load_ext() is None, reason='mmeffvit._ext not built')
@pytest.mark.parametrize('batch,with_pe', [(1, True), (2, True), (2, False)])
def test_fused_qkv_inference_path_matches_the_reference_and_the_naive_form(batch, with_pe,
                                                                           monkeypatch,
                                                                           switch_kernels):
    attn, x = _fused_case(torch.float32, batch, with_pe)
    x = x.detach()
    attn.eval()
    calls = _count(monkeypatch, qkv_ops, '_split_projection_inference')
    switch_kernels.reference()  # the reference: PyTorch FLA, torch's conv
    with torch.no_grad():
        ref = attn(x, (6, 7))
    assert not calls
    switch_kernels()
    with torch.no_grad():
        out = attn(x, (6, 7))
    assert calls == [1]
    torch.testing.assert_close(out, ref, rtol=2e-4, atol=2e-5)
    with torch.no_grad():  # and the explicit N×N form, in float64
        naive = naive_flatten(attn.double(), x.double(), (6, 7)).float()
    torch.testing.assert_close(out, naive, rtol=2e-4, atol=2e-5)


@pytest.mark.skipif(load_ext() is None, reason='mmeffvit._ext not built')
def test_fused_qkv_inference_path_is_not_taken_with_grad_or_hooks(monkeypatch, switch_kernels):
    switch_kernels()
    attn, x = _fused_case(torch.float32, 1, True)
    attn.eval()
    inference = _count(monkeypatch, qkv_ops, '_split_projection_inference')
    training = _count(monkeypatch, qkv_ops._QKVFocusedAttention, 'apply')
    attn(x, (6, 7))  # x needs a gradient
    x = x.detach()
    attn(x, (6, 7))  # the parameters need gradients
    assert not inference and len(training) == 2
    with torch.no_grad():
        attn(x, (6, 7))
        assert inference == [1]
        handle = attn.dwc.register_forward_hook(lambda *args: None)
        attn(x, (6, 7))  # the hooked conv runs as a module
        handle.remove()
        attn.double()(x.double(), (6, 7))  # fp64: the composed operators
    assert inference == [1] and len(training) == 2
