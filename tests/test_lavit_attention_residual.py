"""LaViT's fast paths against plain formulations: the AR module as strided-slice sums vs the
conv formulation, the per-window AR vs the global one cut into windows, SDPA VA layers vs the
explicit scores, and a forward without host synchronisations."""
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from mmeffvit.models import AttentionResidualDownsample, LaViT
from mmeffvit.ops import query_grid_conv_reference
from mmeffvit.models.layers.less_attention import FactoredScores, VanillaAttention

# (in_heads, out_heads, kernel, stride, key_stride, query grid, key grid)
AR_CASES = [(1, 2, 2, 2, 1, (6, 8), (2, 3)), (2, 5, 2, 2, 1, (7, 9), (3, 4)),
            (2, 3, 3, 2, 1, (7, 9), (3, 4)), (2, 3, 2, 2, 2, (5, 6), (5, 6))]


def conv_residual(ar, attn, q_hw, k_hw):
    """The AR module as sec. 3.3 writes it: per key, the heads' maps over the query grid are a
    zero-padded image; depthwise conv, 1x1 conv, LayerScale, optional key average pooling."""
    b, h, _, nk = attn.shape
    x = attn.permute(0, 3, 1, 2).reshape(b * nk, h, *q_hw)
    k, s = ar.dwconv.kernel_size[0], ar.stride
    x = F.pad(x, (0, (-q_hw[1]) % s + k - s, 0, (-q_hw[0]) % s + k - s))
    x = F.conv2d(x, ar.dwconv.weight, ar.dwconv.bias, stride=s, groups=h)
    x = F.conv2d(x, ar.pwconv.weight, ar.pwconv.bias) * ar.gamma.view(1, -1, 1, 1)
    nq = x.shape[-2] * x.shape[-1]
    x = x.reshape(b, nk, -1, nq).permute(0, 2, 3, 1)
    if ar.key_stride > 1:
        grid = x.reshape(-1, nq, *k_hw)
        grid = F.avg_pool2d(grid, ar.key_stride, ar.key_stride, ceil_mode=True)
        x = grid.reshape(b, -1, nq, grid.shape[-2] * grid.shape[-1])
    return x


def random_ar(hi, ho, k, s, ks):
    ar = AttentionResidualDownsample(hi, ho, kernel_size=k, stride=s, key_stride=ks,
                                     layer_scale_init=0.5)
    with torch.no_grad():
        for p in ar.parameters():
            p.normal_()
    return ar


def grads(loss, ar, attn):
    names = [n for n, _ in ar.named_parameters()]
    values = torch.autograd.grad(loss, [p for _, p in ar.named_parameters()] + [attn])
    return dict(zip(names + ['attn'], values))


@pytest.mark.parametrize('case', AR_CASES)
def test_residual_equals_conv_formulation_with_gradients(case):
    hi, ho, k, s, ks, q_hw, k_hw = case
    torch.manual_seed(0)
    ar = random_ar(hi, ho, k, s, ks)
    assert [n for n, _ in ar.named_parameters()] == [
        'gamma', 'dwconv.weight', 'dwconv.bias', 'pwconv.weight', 'pwconv.bias']
    attn = torch.randn(2, hi, q_hw[0] * q_hw[1], k_hw[0] * k_hw[1], dtype=torch.float64,
                       requires_grad=True)
    ar = ar.double()
    out, ref = ar(attn, q_hw, k_hw), conv_residual(ar, attn, q_hw, k_hw)
    torch.testing.assert_close(out, ref)
    weight = torch.randn_like(ref)
    got, want = grads((out * weight).sum(), ar, attn), grads((ref * weight).sum(), ar, attn)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name)


def test_traced_path_is_the_official_two_convs_and_equals_the_function():
    torch.manual_seed(0)
    for k in (2, 3):
        attn = torch.randn(2, 3, 63, 6)  # query grid 7x9, 6 keys
        ar = AttentionResidualDownsample(3, 4, kernel_size=k)
        for p in ar.parameters():  # constants of the traced function
            p.requires_grad_(False).normal_()
        weight, _ = ar.folded()
        out_hw = ar.out_grid((7, 9))
        with torch.no_grad():
            ref = query_grid_conv_reference(attn.reshape(2, 3, 7, 9, 6), weight, 2, out_hw)
            traced = torch.jit.trace(lambda a: ar._conv(a, (7, 9), out_hw, weight), attn)
            torch.testing.assert_close(traced(attn).reshape(ref.shape), ref, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                ar._conv(attn, (7, 9), out_hw, weight).reshape(ref.shape), ref, rtol=1e-5,
                atol=1e-5)


def test_counted_macs_are_those_of_the_official_depthwise_and_pointwise_convs():
    from mmeffvit.analysis.complexity import analyze

    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ar = AttentionResidualDownsample(3, 4, kernel_size=2)

        def forward(self, attn):
            return self.ar(attn, (7, 9), (2, 3))

    report = analyze(Residual(), torch.randn(2, 3, 63, 6))
    outputs = 2 * 6 * 4 * 5  # images x keys x the 4x5 downsampled query grid
    # depthwise: 3 maps x 2x2 taps; pointwise: 4 x 3; the folded kernel would count 4 x 3 x 2x2
    assert report.by_operator['conv'] == outputs * (3 * 4 + 4 * 3)
    # and once per call the folded bias (pointwise weight x depthwise bias, parameters only)
    assert report.macs == outputs * (3 * 4 + 4 * 3) + 4 * 3


def cut_into_windows(res, q_hw, k_hw, n_win, q_win, k_win):
    """Window blocks of a global residual ``(B, o, Hq*Wq, Hk*Wk)``, query/key grids zero-padded
    (or cropped) to whole windows, by loops."""
    b, o = res.shape[:2]
    (nh, nw), (qh, qw), (kh, kw) = n_win, q_win, k_win
    full = res.new_zeros(b, o, nh * qh, nw * qw, nh * kh, nw * kw)
    grid = res.reshape(b, o, *q_hw, *k_hw)
    r, c = min(q_hw[0], nh * qh), min(q_hw[1], nw * qw)
    kr, kc = min(k_hw[0], nh * kh), min(k_hw[1], nw * kw)
    full[:, :, :r, :c, :kr, :kc] = grid[:, :, :r, :c, :kr, :kc]
    blocks = [full[i, :, a * qh:(a + 1) * qh, w * qw:(w + 1) * qw, a * kh:(a + 1) * kh,
                   w * kw:(w + 1) * kw].reshape(o, qh * qw, kh * kw)
              for i in range(b) for a in range(nh) for w in range(nw)]
    return torch.stack(blocks)


@pytest.mark.parametrize('case', [
    # (in, out, kernel, key stride, query grid, key grid, windows, query / key cells per window)
    (2, 5, 2, 1, (8, 12), (2, 3), (1, 1), (4, 6), (2, 3)),      # one window, exact
    (2, 5, 2, 1, (7, 9), (3, 4), (2, 2), (2, 3), (2, 2)),       # odd grids: padding both ways
    (2, 5, 2, 1, (28, 38), (9, 11), (2, 2), (7, 10), (4, 5)),   # keys cropped, queries padded
    (2, 3, 2, 2, (20, 28), (20, 27), (2, 3), (6, 6), (6, 6)),   # pooled keys, partial cells
    (2, 3, 3, 1, (7, 9), (3, 4), (2, 2), (2, 3), (2, 2))])      # overlapping kernel
def test_per_window_residual_equals_global_cut_into_windows(case):
    hi, ho, k, ks, q_hw, k_hw, n_win, q_win, k_win = case
    torch.manual_seed(0)
    ar = random_ar(hi, ho, k, 2, ks).double()
    attn = torch.randn(2, hi, q_hw[0] * q_hw[1], k_hw[0] * k_hw[1], dtype=torch.float64,
                       requires_grad=True)
    out = ar.forward_windows(attn, q_hw, k_hw, n_win, q_win, k_win)
    k_out = tuple(-(-n // ks) for n in k_hw)
    ref = cut_into_windows(ar(attn, q_hw, k_hw), ar.out_grid(q_hw), k_out, n_win, q_win, k_win)
    torch.testing.assert_close(out, ref)
    weight = torch.randn_like(ref)
    got, want = grads((out * weight).sum(), ar, attn), grads((ref * weight).sum(), ar, attn)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name)
    # the gather index is built once per shape
    assert len(ar._window_cache) == 1
    ar.forward_windows(attn, q_hw, k_hw, n_win, q_win, k_win)
    assert len(ar._window_cache) == 1


@pytest.mark.parametrize('with_mask', [False, True])
def test_vanilla_attention_without_scores_equals_explicit_scores(with_mask):
    torch.manual_seed(0)
    va = VanillaAttention(16, 2, sr_ratio=2).double()
    x = torch.randn(3, 6 * 8, 16, dtype=torch.float64, requires_grad=True)
    residual = torch.randn(3, 2, 48, 12, dtype=torch.float64)
    mask = torch.zeros(3, 1, 1, 12, dtype=torch.bool)
    mask[1, ..., 8:] = True
    mask = mask if with_mask else None
    for res in (None, residual):
        fast, scores, probs, k_hw = va(x, (6, 8), res, mask, need_scores=False)
        assert scores is None and probs is None and k_hw == (3, 4)
        ref = va(x, (6, 8), res, mask)[0]
        tol = dict(rtol=1e-5, atol=1e-6)  # the explicit path's softmax runs in fp32
        torch.testing.assert_close(fast, ref, **tol)
        g_fast = torch.autograd.grad(fast.square().sum(), [x] + list(va.parameters()))
        g_ref = torch.autograd.grad(ref.square().sum(), [x] + list(va.parameters()))
        for a, b in zip(g_fast, g_ref):
            torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_vanilla_attention_inference_blocks_equal_the_full_maps(monkeypatch, dtype):
    """Without probabilities, inference makes scores, softmax and output by blocks of query
    rows (here 5 rows a block, the last one shorter): the same scores and output."""
    import importlib
    attention_ops = importlib.import_module('mmeffvit.ops.attention')
    torch.manual_seed(0)
    va = VanillaAttention(16, 2, sr_ratio=2).to(dtype).eval()
    x = torch.randn(3, 6 * 8, 16, dtype=dtype)
    residual = torch.randn(3, 2, 48, 12, dtype=dtype)
    # equal up to the summation order of GEMMs of other shapes
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(attention_ops, '_SCORE_BLOCK_ELEMENTS', 3 * 2 * 12 * 5)
    for res in (None, residual, residual[:1, :, :, :1]):
        with torch.no_grad():
            out, scores, probs, _ = va(x, (6, 8), res, need_probs=False)
            ref_out, ref_scores, ref_probs, _ = va(x, (6, 8), res)
        assert probs is None and ref_probs is not None
        torch.testing.assert_close(scores, ref_scores, **tol)
        torch.testing.assert_close(out, ref_out, **tol)


def test_forward_has_no_host_synchronisation():
    """Masks and windows are decided on integers: no ``.item()`` / ``bool(tensor)`` in a forward
    (each is an ``aten::_local_scalar_dense`` call, a device sync on a GPU)."""
    model = LaViT('tiny', drop_path_rate=0.).eval()
    x = torch.rand(1, 3, 150, 230)  # padded windows in stages 3-4: key masks are built
    with torch.no_grad():
        model(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(x)
    names = [e.key for e in prof.key_averages()]
    assert 'aten::_local_scalar_dense' not in names
    assert len(model._mask_cache) == 2  # stages 3 and 4, reused by the second forward


def random_factors(b, h, q_hw, k_hw, features=5, key_heads=None):
    query = torch.randn(b, h, q_hw[0] * q_hw[1], features, dtype=torch.float64,
                        requires_grad=True)
    key = torch.randn(b, key_heads or h, k_hw[0] * k_hw[1], features, dtype=torch.float64,
                      requires_grad=True)
    return FactoredScores(query, key)


@pytest.mark.parametrize('case', [
    # (in, out, kernel, query grid, key grid, next stage's key grid, key heads)
    (1, 2, 2, (6, 8), (2, 3), None, None),
    (2, 5, 2, (7, 9), (3, 4), (3, 4), 1),       # keys shared by the heads
    (2, 3, 3, (7, 9), (3, 4), (2, 5), None),    # overlapping kernel; keys cropped and padded
    (2, 5, 2, (8, 6), (3, 3), (4, 4), None)])   # padded keys: the bias column stays
def test_factored_residual_equals_the_residual_of_the_map(case):
    hi, ho, k, q_hw, k_hw, out_k_hw, key_heads = case
    torch.manual_seed(0)
    ar = random_ar(hi, ho, k, 2, 1).double()
    scores = random_factors(2, hi, q_hw, k_hw, key_heads=key_heads)
    out = ar(scores, q_hw, k_hw, out_k_hw=out_k_hw)
    ref = ar(scores.dense(), q_hw, k_hw, out_k_hw=out_k_hw)
    assert isinstance(out, FactoredScores)
    padded = out_k_hw is not None and any(o > i for o, i in zip(out_k_hw, k_hw))
    assert out.invariant_tail == (0 if padded else 1)
    if out.invariant_tail:  # the tail adds one constant per head to every score
        tail = out.query[..., -1:] @ out.key[..., -1:].transpose(-2, -1)
        torch.testing.assert_close(tail, tail[..., :1, :1].expand_as(tail))
    torch.testing.assert_close(out.dense(), ref)
    weight = torch.randn_like(ref)
    inputs = list(scores[:2]) + list(ar.parameters())
    got = torch.autograd.grad((out.dense() * weight).sum(), inputs)
    want = torch.autograd.grad((ref * weight).sum(), inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize('case', [
    # (out, kernel, query grid, key grid, windows, query / key cells per window, key heads)
    (5, 2, (8, 12), (2, 3), (1, 1), (4, 6), (2, 3), None),
    (5, 2, (7, 9), (3, 4), (2, 2), (2, 3), (2, 2), 1),        # padding both ways
    (5, 2, (28, 38), (9, 11), (2, 2), (7, 10), (4, 5), None),  # keys cropped, queries padded
    (3, 3, (7, 9), (3, 4), (2, 2), (2, 3), (2, 2), None)])     # overlapping kernel
def test_factored_window_residual_equals_that_of_the_map(case):
    ho, k, q_hw, k_hw, n_win, q_win, k_win, key_heads = case
    torch.manual_seed(0)
    ar = random_ar(2, ho, k, 2, 1).double()
    scores = random_factors(2, 2, q_hw, k_hw, key_heads=key_heads)
    out = ar.forward_windows(scores, q_hw, k_hw, n_win, q_win, k_win)
    ref = ar.forward_windows(scores.dense(), q_hw, k_hw, n_win, q_win, k_win)
    torch.testing.assert_close(out, ref)
    weight = torch.randn_like(ref)
    inputs = list(scores[:2]) + list(ar.parameters())
    got = torch.autograd.grad((out * weight).sum(), inputs)
    want = torch.autograd.grad((ref * weight).sum(), inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize('tail', [0, 1])
def test_vanilla_attention_on_factors_equals_explicit_scores(tail):
    """A factored residual (and factored own scores) give the explicit path's output, scores
    and gradients; on the CPU they run the fused flash kernel (value columns zero-padded to the
    concatenated head size), not the explicit math path."""
    torch.manual_seed(0)
    va = VanillaAttention(16, 2, sr_ratio=2).double()
    x = torch.randn(3, 6 * 8, 16, dtype=torch.float64, requires_grad=True)
    res = random_factors(3, 2, (6, 8), (3, 4), features=4, key_heads=1)
    params = [x] + list(va.parameters()) + list(res[:2])
    if tail:  # a per-head constant on every key (a bias): the softmax may drop it
        ones = torch.ones(3, 2, 48, 1, dtype=torch.float64)
        const = torch.randn(1, 2, 1, 1, dtype=torch.float64, requires_grad=True)
        params.append(const)
        res = FactoredScores(torch.cat([res.query, ones], -1), torch.cat(
            [res.key.expand(3, 2, -1, -1), const.expand(3, 2, 12, 1)], -1), tail)
    tol = dict(rtol=1e-5, atol=1e-6)  # the explicit path's softmax runs in fp32
    ref, ref_scores, _, _ = va(x, (6, 8), res.dense())
    for need_scores in (False, True):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out, scores, probs, k_hw = va(x, (6, 8), res, need_scores=need_scores,
                                          factor_scores=True)
        names = {e.key for e in prof.key_averages()}
        assert 'aten::_scaled_dot_product_flash_attention_for_cpu' in names
        assert 'aten::_scaled_dot_product_attention_math' not in names
        assert probs is None and k_hw == (3, 4)
        torch.testing.assert_close(out, ref, **tol)
        if need_scores:
            assert isinstance(scores, FactoredScores) and scores.invariant_tail == tail
            torch.testing.assert_close(scores.dense(), ref_scores)
        else:
            assert scores is None
        got = torch.autograd.grad(out.square().sum(), params)
        want = torch.autograd.grad(ref.square().sum(), params, retain_graph=True)
        if tail:  # a per-row constant has no gradient: zero here, fp32 softmax noise there
            assert got[-1].abs().max() == 0 and want[-1].abs().max() < 1e-5
            got, want = got[:-1], want[:-1]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, **tol)
    # its own scores factored without a residual; asked for a map, it gives the map
    out, scores, _, _ = va(x, (6, 8), need_scores=True, factor_scores=True)
    ref, ref_scores, _, _ = va(x, (6, 8))
    torch.testing.assert_close(scores.dense(), ref_scores)
    torch.testing.assert_close(out, ref, **tol)
    out, scores, _, _ = va(x, (6, 8), res, need_scores=True)
    assert isinstance(scores, torch.Tensor)
