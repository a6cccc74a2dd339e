"""mmeffvit.ops.window_attention and gathered_window_attention: every path (the compiled CPU
operators, the recomputing backward of a trained bias, torch's attention) against an explicit
float64 softmax, their fallbacks, argument checks, and the models that call them."""
import importlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from mmeffvit import ops
from mmeffvit.models.layers.relative_position import WindowMSA
from mmeffvit.ops import window_attention, window_attention_ref
from mmeffvit.ops.window_attention import (_GatheredKeysAttention,
                                           _gathered_window_attention_applies, gather_keys,
                                           reused_gather_buffer)
from mmeffvit.ops.window_attention import _window_attention_applies as window_attention_applies

needs_ext = pytest.mark.skipif(
    ops.load_ext() is None or not hasattr(ops.load_ext(), 'window_attention_forward'),
    reason='mmeffvit._ext is not built')


@pytest.fixture
def ops_on(monkeypatch, switch_kernels):
    switch_kernels()


def naive(q, k, v, mask, scale):
    """Explicit float64 ``softmax(q·kᵀ·scale + mask)·v``, heads apart ``(BW, n, h, d)``
    (independent of both)."""
    scores = q.double() @ k.double().transpose(-2, -1) * scale
    if mask is not None:
        scores = scores + mask.double()
    return (scores.softmax(-1) @ v.double()).transpose(1, 2)


def assert_close_with_grads(out, ref, inputs, grad):
    """``out`` equals ``ref``, and so do their gradients for ``inputs`` given ``grad``."""
    torch.testing.assert_close(out, ref)
    got = torch.autograd.grad(out, inputs, grad)
    want = torch.autograd.grad(ref, inputs, grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


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
    assert out.shape == (5, n, 3, d) and out.is_contiguous()
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


def test_reference_when_ops_are_off(monkeypatch, switch_kernels):
    switch_kernels.reference()
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
                               naive(qt, qt, qt, None, 0.5).flatten(2), rtol=1e-5, atol=1e-5)


@needs_ext
@pytest.mark.parametrize('window_size', [7, None])
def test_window_msa_inference_matches_sdpa_path(monkeypatch, switch_kernels, window_size):
    """WindowMSA in eval: the compiled operator against MMEFFVIT_OPS=0 (torch's attention),
    with the relative bias and a shift mask."""
    torch.manual_seed(0)
    attn = WindowMSA(64, 4, window_size=window_size).eval()
    if window_size is not None:
        torch.nn.init.normal_(attn.relative_position_bias_table, std=0.5)
    x = torch.randn(2 * 6, 49, 64)
    mask = torch.zeros(6, 49, 49).masked_fill(torch.rand(6, 49, 49) < 0.3, -100.)
    with torch.no_grad():
        switch_kernels.reference()
        ref = attn(x, 7, mask)
        switch_kernels()
        out = attn(x, 7, mask)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def gathered_naive(q, bank, index, bias, key_mask, scale):
    """Explicit float64 form of the gathered attention: each window's keys picked from the bank
    by Python indexing, scores plus bias plus key mask, softmax, values; heads apart."""
    bw, h, nq, d = q.shape
    nw, nk = index.shape
    out = torch.empty(bw, nq, h * d, dtype=torch.float64)
    for b in range(bw):
        image, window = divmod(b, nw)
        for head in range(h):
            rows = bank[image, index[window]].double()  # (nk, 2, h·d)
            k = rows[:, 0, head * d:(head + 1) * d]
            v = rows[:, 1, head * d:(head + 1) * d]
            scores = q[b, head].double() @ k.T * scale
            if bias is not None:
                scores = scores + bias[head if bias.shape[0] > 1 else 0].double()
            if key_mask is not None:
                scores = scores + key_mask[window if key_mask.shape[0] > 1 else 0].double()
            out[b, :, head * d:(head + 1) * d] = scores.softmax(-1) @ v
    return out.view(bw, nq, h, d)


def gathered_case(images, nw, nq, nk, heads, d, rows, generator, bias_heads=None,
                  mask_windows=None):
    q = torch.randn(images * nw, nq, 3, heads, d, generator=generator)[:, :, 0].transpose(1, 2)
    bank = torch.randn(images, rows, 2, heads * d, generator=generator)
    index = torch.randint(0, rows, (nw, nk), generator=generator)
    bias = key_mask = None
    if bias_heads is not None:
        bias = torch.randn(bias_heads, nq, nk, generator=generator)
    if mask_windows is not None:
        # Focal's key mask: 0, -100 (official outside keys) and -inf (masked borders)
        key_mask = torch.zeros(mask_windows, nk)
        pick = torch.rand(mask_windows, nk, generator=generator)
        key_mask[pick < 0.2] = -100.
        key_mask[(pick > 0.2) & (pick < 0.4)] = float('-inf')
        key_mask[:, 0] = 0.  # every row keeps a key
    return q, bank, index, bias, key_mask


@needs_ext
@pytest.mark.parametrize('nq,nk,d', [(49, 230, 32), (49, 181, 64), (16, 20, 8), (1, 1, 16)])
@pytest.mark.parametrize('bias_heads,mask_windows', [(None, None), (3, 4), (1, 1), (3, None)])
def test_gathered_matches_explicit_softmax(ops_on, nq, nk, d, bias_heads, mask_windows):
    g = torch.Generator().manual_seed(nq + nk + d)
    case = gathered_case(2, 4, nq, nk, 3, d, 60, g, bias_heads, mask_windows)
    assert ops.gathered_window_attention.__module__.endswith('window_attention')
    assert _gathered_window_attention_applies(*case)
    out = ops.gathered_window_attention(*case, scale=d ** -0.5)
    assert out.shape == (8, nq, 3, d) and out.is_contiguous()
    want = gathered_naive(*case, d ** -0.5)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    # the reference (gather, summed mask, torch's attention) agrees with the same explicit form
    torch.testing.assert_close(ops.gathered_window_attention_ref(*case, d ** -0.5).double(),
                               want, rtol=1e-5, atol=1e-5)


def test_gathered_reference_when_ops_are_off(monkeypatch, switch_kernels):
    switch_kernels.reference()
    case = gathered_case(1, 3, 9, 14, 2, 8, 20, torch.Generator().manual_seed(6), 2, 3)
    assert not _gathered_window_attention_applies(*case)
    torch.testing.assert_close(ops.gathered_window_attention(*case).double(),
                               gathered_naive(*case, 8 ** -0.5), rtol=1e-5, atol=1e-5)
    q, bank, index, bias, key_mask = case
    with RecordOps() as record:  # a MAC counter sees torch's attention
        switch_kernels()
        ops.gathered_window_attention(q, bank, index, bias, key_mask)
    assert any('scaled_dot_product' in name for name in record.names)


@needs_ext
def test_gathered_entry_point_checks_arguments():
    ext = ops.load_ext()
    q, bank, index, bias, key_mask = gathered_case(2, 3, 9, 14, 2, 8, 20,
                                                   torch.Generator().manual_seed(7), 2, 3)
    call = ext.gathered_window_attention_forward
    with pytest.raises(RuntimeError, match=r'index values must lie in \[0, 20\)'):
        call(q, bank, index.masked_fill(index == index[0, 0], 20), bias, key_mask, 1.0)
    with pytest.raises(RuntimeError, match='index values'):
        call(q, bank, index.masked_fill(index == index[0, 0], -1), bias, key_mask, 1.0)
    with pytest.raises(RuntimeError, match='int64 index'):
        call(q, bank, index.int(), bias, key_mask, 1.0)
    with pytest.raises(RuntimeError, match='int64 index'):
        call(q, bank, index[:2], bias, key_mask, 1.0)  # 2·2 windows, 6 queries
    with pytest.raises(RuntimeError, match='bank'):
        call(q, bank[..., :8], index, bias, key_mask, 1.0)
    with pytest.raises(RuntimeError, match='bias'):
        call(q, bank, index, bias[..., :5], key_mask, 1.0)
    with pytest.raises(RuntimeError, match='key mask'):
        call(q, bank, index, bias, key_mask[:2], 1.0)
    with pytest.raises(RuntimeError, match='at least one key'):
        call(q, bank, index[:, :0], None, None, 1.0)
    with pytest.raises(RuntimeError, match='float32'):
        call(q.double(), bank.double(), index, None, None, 1.0)


@needs_ext
@pytest.mark.parametrize('mask_borders,levels,size', [(True, 2, (61, 90)), (False, 2, (64, 96)),
                                                      (True, 3, (75, 57))])
def test_focal_inference_matches_sdpa_path(monkeypatch, switch_kernels, mask_borders, levels,
                                           size):
    """Focal-T-like backbone in eval, float32: the gathered operator (keys read through the
    index, bias and key mask added in the kernel) against MMEFFVIT_OPS=0 (gathered keys,
    summed mask, torch's attention), borders masked (-inf) or official (-100), odd sizes."""
    from mmeffvit.models import FocalTransformer
    ext = ops.load_ext()
    calls, compiled = [], []
    entry, kernel = ops.gathered_window_attention, ext.gathered_window_attention_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return entry(*args, **kwargs)

    def counted_kernel(*args):
        compiled.append(1)
        return kernel(*args)

    monkeypatch.setattr(ops, 'gathered_window_attention', counted)
    monkeypatch.setattr(ext, 'gathered_window_attention_forward', counted_kernel)
    torch.manual_seed(0)
    model = FocalTransformer(dict(embed_dims=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4]),
                             focal_levels=[levels] * 4, mask_borders=mask_borders,
                             drop_path_rate=0.).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # the window table starts at zero
            if 'relative_position' in name:
                p.normal_(std=0.5)
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        switch_kernels.reference()
        ref = model(x)
        assert calls and not compiled
        calls.clear()
        switch_kernels()
        out = model(x)
    assert len(compiled) == len(calls) == 5  # every block took the compiled operator
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_gathered_keys_attention_gradients_match_autograd_through_the_gather():
    """The training path that gathers keys again in backward (bias with a gradient) against
    autograd through the gather and an explicit softmax, float64; the index repeats keys (ring
    duplicates, the zero token) so that the scatter back into the bank adds."""
    gen = torch.Generator().manual_seed(5)
    b, nw, heads, n, d, m = 2, 3, 2, 4, 3, 9
    q = torch.randn(b * nw, heads, n, d, generator=gen, dtype=torch.float64, requires_grad=True)
    bank = torch.randn(b, m, 2, heads * d, generator=gen, dtype=torch.float64,
                       requires_grad=True)
    index = torch.randint(0, m, (nw, 6), generator=gen)
    index[:, -1] = m - 1  # every window reads the last token
    bias = torch.randn(1, heads, n, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(b * nw, 1, 1, 6, dtype=torch.float64)
    mask[::2, ..., 0] = float('-inf')
    grad = torch.randn(b * nw, heads, n, d, generator=gen, dtype=torch.float64)
    out = _GatheredKeysAttention.apply(q, bank, index, bias, mask, 0.4)
    k, v = gather_keys(bank, index, heads)
    ref = ((q @ k.transpose(-2, -1)) * 0.4 + bias + mask).softmax(-1) @ v
    assert_close_with_grads(out, ref, (q, bank, bias), grad)


def test_gather_keys_matches_indexing_and_reuses_one_buffer():
    gen = torch.Generator().manual_seed(3)
    b, m, heads, d = 2, 11, 3, 4
    bank = torch.randn(b, m, 2, heads * d, generator=gen)
    index = torch.randint(0, m, (5, 7), generator=gen)

    def expected(idx):  # plain indexing, image by image
        kv = torch.stack([bank[i, idx.reshape(-1)] for i in range(b)])  # (b, nW·N, 2, C)
        kv = kv.view(b * idx.shape[0], idx.shape[1], 2, heads, d)
        return kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)

    def storage(t):
        return t.untyped_storage().data_ptr()

    with reused_gather_buffer():
        first = gather_keys(bank, index, heads)
        for got, want in zip(first, expected(index)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        second = gather_keys(bank, index[:3, :5], heads)  # a later, smaller block
        for got, want in zip(second, expected(index[:3, :5])):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert storage(second[0]) == storage(first[0])
        # autograd through the bank: a tensor of its own, and the gradient arrives
        trained = bank.clone().requires_grad_()
        k, v = gather_keys(trained, index, heads)
        assert storage(k) != storage(first[0])
        (k.sum() + 2 * v.sum()).backward()
        counts = torch.bincount(index.reshape(-1), minlength=m).float()
        torch.testing.assert_close(trained.grad[:, :, 0], counts[None, :, None].expand(b, m, 12))
    outside = gather_keys(bank, index, heads)
    assert storage(outside[0]) != storage(first[0])


def test_gathered_attention_backward_reuses_the_forward_workspace():
    """Blocks run inside one scope (as the backbone's forward): their backwards reuse the
    forward's workspace, the last one frees it, and every gradient equals the one computed
    without a workspace (fresh tensors)."""
    rp = importlib.import_module('mmeffvit.ops.window_attention')  # the function shadows it
    gen = torch.Generator().manual_seed(7)
    b, heads, d, m = 2, 2, 3, 10
    q = torch.randn(b * 3, heads, 4, d, generator=gen, requires_grad=True)
    bank = torch.randn(b, m, 2, heads * d, generator=gen, requires_grad=True)
    indexes = [torch.randint(0, m, (3, n), generator=gen) for n in (6, 8, 5)]  # grow, shrink
    bias = torch.randn(1, heads, 4, 8, generator=gen, requires_grad=True)
    mask = torch.zeros(b * 3, 1, 1, 8)
    mask[1::2, ..., 0] = float('-inf')

    def run():
        x = q
        for index in indexes:  # each block attends with the previous output as its query
            n = index.shape[1]
            x = rp._GatheredKeysAttention.apply(x, bank * 1.5, index, bias[..., :n],
                                                mask[..., :n], 0.5)
        return torch.autograd.grad(x.square().sum(), (q, bank, bias))

    want = run()
    used = []
    get = rp.Workspace.get

    def spy(self, name, *args):
        used.append(name)
        return get(self, name, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rp.Workspace, 'get', spy)
        with rp.reused_gather_buffer():
            workspace = rp.current_workspace()
            x = q
            for index in indexes:
                n = index.shape[1]
                x = rp._GatheredKeysAttention.apply(x, bank * 1.5, index, bias[..., :n],
                                                    mask[..., :n], 0.5)
        assert workspace.calls == 3 and set(workspace.buffers) == {
            ('keys', torch.float32, torch.device('cpu')),
            ('scores', torch.float32, torch.device('cpu'))}
        got = torch.autograd.grad(x.square().sum(), (q, bank, bias))
    assert {'grad_scores', 'grad_k', 'grad_v'} <= set(used)
    assert workspace.buffers == {}  # freed by the last backward
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('path', ['reference', 'kernels'])
@pytest.mark.parametrize('with_mask', [False, True])
def test_trained_bias_matches_explicit_softmax_with_gradients(switch_kernels, path, with_mask):
    """A relative bias that needs a gradient (training the table): output and the gradients of
    q, k, v and the bias against autograd through an explicit softmax, float64, v narrower
    than q; the backward recomputes the probabilities on either policy."""
    switch_kernels.reference() if path == 'reference' else switch_kernels(required=False)
    gen = torch.Generator().manual_seed(11)
    q, k = (torch.randn(6, 2, 9, 4, generator=gen, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    v = torch.randn(6, 2, 9, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(1, 2, 9, 9, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = None
    if with_mask:
        mask = torch.zeros(6, 1, 9, 9, dtype=torch.float64).masked_fill(
            torch.rand(6, 1, 9, 9, generator=gen) < 0.3, -100.)
    out = window_attention(q, k, v, mask, 0.4, bias=bias)
    assert out.shape == (6, 9, 2, 3)
    assert 'Recomputed' in type(out.grad_fn.next_functions[0][0]).__name__
    scores = q @ k.transpose(-2, -1) * 0.4 + bias + (0 if mask is None else mask)
    ref = (scores.softmax(-1) @ v).transpose(1, 2)
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    assert_close_with_grads(out, ref, (q, k, v, bias), grad)
    # a bias without a gradient is summed with the mask: the reference's form
    torch.testing.assert_close(window_attention(q, k, v, mask, 0.4, bias=bias.detach()),
                               window_attention_ref(q, k, v, mask, 0.4, bias=bias.detach()))


def test_dropout_runs_torch_attention_with_the_summed_mask():
    gen = torch.Generator().manual_seed(12)
    q, k, v = qkv_views(4, 16, 2, 8, gen)
    bias = torch.randn(1, 2, 16, 16, generator=gen)
    mask = torch.zeros(4, 1, 16, 16).masked_fill(torch.rand(4, 1, 16, 16, generator=gen) < .3,
                                                 -100.)
    torch.manual_seed(0)
    out = window_attention(q, k, v, mask, 0.3, bias=bias, dropout=0.5)
    torch.manual_seed(0)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias + mask, dropout_p=0.5,
                                          scale=0.3).transpose(1, 2)
    assert torch.equal(out, want)
    assert not torch.allclose(out, window_attention(q, k, v, mask, 0.3, bias=bias))


@pytest.mark.parametrize('path', ['reference', 'kernels'])
@pytest.mark.parametrize('mask_windows', [None, 3, 1])
def test_gathered_trained_bias_matches_explicit_softmax_with_gradients(switch_kernels, path,
                                                                       mask_windows):
    """Focal's training path through the entry point (tables trained: the bias needs a
    gradient): output and the gradients of q, the bank and the bias against autograd through
    the explicit Python-indexed form, float64, the bias given as the model's ``(h, nq, nk)``."""
    switch_kernels.reference() if path == 'reference' else switch_kernels(required=False)
    gen = torch.Generator().manual_seed(13)
    q, bank, index, bias, key_mask = gathered_case(2, 3, 5, 7, 2, 4, 11, gen, 2, mask_windows)
    q, bank, bias = (t.double().requires_grad_() for t in (q, bank, bias))
    key_mask = None if key_mask is None else key_mask.double()
    out = ops.gathered_window_attention(q, bank, index, bias, key_mask, 0.4)
    assert out.shape == (6, 5, 2, 4)
    ref = gathered_naive(q, bank, index, bias, key_mask, 0.4)
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    assert_close_with_grads(out, ref, (q, bank, bias), grad)


def test_gathered_dropout_runs_torch_attention_on_the_gathered_keys():
    gen = torch.Generator().manual_seed(14)
    q, bank, index, bias, key_mask = gathered_case(2, 3, 5, 7, 2, 4, 11, gen, 2, 3)
    torch.manual_seed(0)
    out = ops.gathered_window_attention(q, bank, index, bias, key_mask, 0.4, dropout=0.5)
    k, v = gather_keys(bank, index, 2)
    mask = (bias[None] + key_mask[:, None, None]).repeat(2, 1, 1, 1)
    torch.manual_seed(0)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.5, scale=0.4)
    assert torch.equal(out, want.transpose(1, 2))
