"""CSWin's stripe attention with LePE as Triton kernels (``mmeffvit::stripe_attention``), against
a stripe-by-stripe float64 reference on the unpadded map (interpreted without a GPU, see
test_triton_flatten.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from mmeffvit import ops
from mmeffvit.analysis.kernel_count import KernelCounter
from test_triton_flatten import DEVICE, TOL, _OpNames, _relative

pytest.importorskip('triton')

# (map, window, heads, channels): vertical stripes that do not tile the map, horizontal ones of
# 91 tokens (two key blocks) on a map padded below, the whole map (three key blocks) with heads
# of 16 channels, heads of 24 channels
CASES = [((9, 11), (9, 3), 2, 32), ((10, 13), (7, 13), 2, 32), ((12, 13), (12, 13), 1, 16),
         ((6, 8), (2, 8), 2, 48)]


def _case(hw, c, dtype, seed=0):
    """q, k, v as CSWin's block gets them (channel slices of one ``(B, N, 3C)`` projection),
    LePE's weight and bias."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(2, hw[0] * hw[1], 3 * c, generator=g).to(DEVICE, dtype)
    weight = torch.randn(c, 1, 3, 3, generator=g).to(DEVICE)
    bias = torch.randn(c, generator=g).to(DEVICE)
    return list(qkv.chunk(3, dim=-1)) + [weight, bias]


def _reference(q, k, v, weight, bias, hw, window, heads):
    """Window by window on the unpadded map (the last ones simply smaller), per head, float64."""
    b, _, c = q.shape
    (h, w), (wh, ww) = hw, window
    d = c // heads
    maps = [t.double().transpose(1, 2).reshape(b, c, h, w) for t in (q, k, v)]
    out = torch.zeros(b, c, h, w, dtype=torch.float64)
    for y in range(0, h, wh):
        for x in range(0, w, ww):
            qs, ks, vs = (m[:, :, y:y + wh, x:x + ww] for m in maps)
            rows, cols = qs.shape[-2:]
            lepe = F.conv2d(vs, weight.double(), bias.double(), padding=1, groups=c)
            for head in range(heads):
                ch = slice(head * d, (head + 1) * d)
                qh, kh, vh = (t[:, ch].flatten(2).transpose(1, 2) for t in (qs, ks, vs))
                att = ((qh @ kh.transpose(1, 2)) * d ** -0.5).softmax(-1) @ vh
                out[:, ch, y:y + rows, x:x + cols] = (att.transpose(1, 2).reshape(b, d, rows, cols)
                                                      + lepe[:, ch])
    return out.flatten(2).transpose(1, 2)


def _params():
    """Every case in fp32; 16-bit inputs on the first two in the default run (the interpreter
    takes seconds a case), on all in the slow one."""
    for i, case in enumerate(CASES):
        for dtype in TOL:
            marks = [pytest.mark.slow] if i > 1 and dtype != torch.float32 else []
            yield pytest.param(case, dtype, marks=marks, id=f'{case[0]}-{case[1]}-{case[2]}x'
                               f'{case[3]}-{str(dtype).split(".")[-1]}')


@pytest.mark.parametrize('case,dtype', _params())
def test_forward_and_backward_match_the_reference(case, dtype):
    hw, window, heads, c = case
    inputs = _case(hw, c, dtype)
    assert not inputs[0].is_contiguous()
    leaves = [t.detach().requires_grad_() for t in inputs]
    with ops.use_kernels(required=False, triton=True), _OpNames() as seen:
        out = ops.stripe_attention(*leaves[:3], hw, window, heads, *leaves[3:])
    assert seen.names == ['mmeffvit.stripe_attention']  # one op, nothing around it
    assert out.shape == inputs[0].shape and out.dtype == dtype
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_leaves = [t.detach().double().requires_grad_() for t in inputs]
    ref = _reference(*ref_leaves, hw, window, heads)
    ref.backward(grad.double())
    assert _relative(out, ref) < TOL[dtype]
    for name, leaf, want in zip(('q', 'k', 'v', 'weight', 'bias'), leaves, ref_leaves):
        assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype, name
        assert _relative(leaf.grad, want.grad) < TOL[dtype] * 2, name


def test_entry_point_takes_the_composed_path_unless_selected():
    """The default policy, attention dropout, float64: the composed path, equal to the op."""
    hw, window, heads, c = CASES[0]
    q, k, v, weight, bias = _case(hw, c, torch.float32, seed=1)
    with ops.use_kernels(required=False, triton=True):
        fused = ops.stripe_attention(q, k, v, hw, window, heads, weight, bias)
        with _OpNames() as seen:
            torch.manual_seed(0)
            ops.stripe_attention(q, k, v, hw, window, heads, weight, bias, dropout=0.1)
            ops.stripe_attention(q.double(), k.double(), v.double(), hw, window, heads,
                                 weight.double(), bias.double())
    with _OpNames() as default:
        composed = ops.stripe_attention(q, k, v, hw, window, heads, weight, bias)
    assert not any(n.startswith('mmeffvit.') for n in seen.names + default.names)
    assert _relative(fused, composed) < TOL[torch.float32]


def test_bad_arguments_are_refused():
    q, k, v, weight, bias = _case((4, 6), 16, torch.float32)
    with pytest.raises(ValueError, match='tokens'):
        ops.stripe_attention(q, k, v, (5, 6), (4, 2), 2, weight, bias)
    with pytest.raises(ValueError, match='heads'):
        ops.stripe_attention(q, k, v, (4, 6), (4, 2), 3, weight, bias)
    with pytest.raises(ValueError, match='LePE'):
        ops.stripe_attention(q, k, v, (4, 6), (4, 2), 2, weight[:8], bias)
    with pytest.raises(ValueError, match='positive'):
        ops.stripe_attention(q, k, v, (4, 6), (0, 2), 2, weight, bias)
    with pytest.raises(ValueError, match='shape'):
        ops.stripe_attention(q, k[:1], v, (4, 6), (4, 2), 2, weight, bias)


def test_fake_cuda_is_one_launch():
    """FLatten-CSWin-T's stage 3 at 800×1333 (a 50×84 map, 7-wide stripes of 350 and 588
    tokens) on fake CUDA tensors: one launch a branch."""
    with FakeTensorMode():
        qkv = torch.empty(2, 50 * 84, 3 * 256, device='cuda', dtype=torch.bfloat16)
        weight, bias = torch.empty(128, 1, 3, 3, device='cuda'), torch.empty(128, device='cuda')
        q, k, v = qkv.chunk(3, dim=-1)
        with ops.use_kernels(required=False, triton=True), KernelCounter() as counter:
            outs = [ops.stripe_attention(q[..., sl], k[..., sl], v[..., sl], (50, 84), window, 4,
                                         weight, bias)
                    for sl, window in ((slice(0, 128), (50, 7)), (slice(128, None), (7, 84)))]
    assert dict(counter.count.by_op) == {'mmeffvit.stripe_attention': 2}
    # 2 images: 12 stripes of 350 tokens and 8 of 7×84 = 588 (the last one padded), 128
    # channels a branch; LePE's 9 taps at each of the 4200 tokens in both branches
    assert counter.count.flops == 2 * (4 * (12 * 350 ** 2 + 8 * 588 ** 2) * 128
                                       + 2 * 18 * 4200 * 128)
    assert [o.shape for o in outs] == [(2, 4200, 128)] * 2


@pytest.mark.slow
def test_ops_registered_with_fake_and_autograd():
    q, k, v, weight, bias = _case((5, 6), 16, torch.float32, seed=2)
    args = (q, k, v, weight, bias, 5, 6, 5, 2, 2, 0.3)
    torch.library.opcheck(torch.ops.mmeffvit.stripe_attention.default,
                          tuple(t.detach().requires_grad_() if isinstance(t, torch.Tensor) else t
                                for t in args))
    out, lse = torch.ops.mmeffvit.stripe_attention(*args)
    torch.library.opcheck(torch.ops.mmeffvit.stripe_attention_backward.default,
                          (torch.randn_like(out), q, k, v, weight, lse, 5, 6, 5, 2, 2, 0.3))


def test_backbone_compiles_as_one_graph_with_the_op():
    """A small FLatten-CSWin with the Triton ops selected compiles as one graph with the stripe
    op in it (its training step on the op: test_triton_flatten.py, ALSO_RUN)."""
    from test_backbone_contract import build
    torch.manual_seed(0)
    model = build('FLattenCSWin').to(DEVICE).eval()
    x = torch.randn(1, 3, 64, 96, device=DEVICE)
    with ops.use_kernels(required=False, triton=True), torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
        eager = model(x)
        compiled = torch.compile(model, backend='eager', fullgraph=True)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert 'mmeffvit.stripe_attention' in '\n'.join(g.code for g in explained.graphs)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b)
