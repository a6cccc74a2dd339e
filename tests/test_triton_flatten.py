"""FLatten's focused linear attention as Triton kernels (``mmeffvit::focused_linear_attention``),
against the PyTorch reference evaluated in float64.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set by
conftest.py), where every ``tl.dot`` takes fp32 operands (its 16-bit dot is wrong); on a GPU the
same tests run the compiled kernels.
"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from mmeffvit import ops
from mmeffvit.analysis.kernel_count import NO_KERNEL, KernelCounter
from mmeffvit.ops import focused_linear_attention, focused_linear_attention_ref
from mmeffvit.ops.triton_kernels import registered_ops, runs_on, selected

pytest.importorskip('triton')
registered_ops()  # the ops, registered
DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
# largest error over the largest reference value: fp32 sums, or rounding of 16-bit inputs,
# operands and output
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}

# (batch, queries, keys, C, Ce, heads, p): odd token counts, one or several token blocks and
# partial states, heads of 24, 64 and 16 channels, a non-integer power
SHAPES = [(2, 70, 70, 64, 64, 1, 3), (1, 33, 9, 72, 72, 3, 3), (2, 1, 300, 32, 48, 2, 2.5),
          (1, 130, 517, 48, 48, 2, 3)]


def _inputs(b, n_q, n, c, ce, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, t, w, generator=g) for t, w in ((n_q, c), (n, c), (n, ce)))
    scale = torch.randn(c, generator=g) * 0.5
    return [t.to(DEVICE, dtype) for t in (q, k, v)] + [scale.to(DEVICE)]


def _reference(q, k, v, scale, heads, p, residual=None):
    """The reference in float64 on the (already rounded) inputs."""
    out = focused_linear_attention_ref(q.double(), k.double(), v.double(), scale.double(), heads, p)
    return out if residual is None else out + residual.double()


def _relative(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize('dtype', list(TOL), ids=lambda d: str(d).split('.')[-1])
@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'x'.join(map(str, s)))
def test_forward_matches_the_reference(shape, dtype):
    b, n_q, n, c, ce, heads, p = shape
    q, k, v, scale = _inputs(b, n_q, n, c, ce, dtype)
    out, state = torch.ops.mmeffvit.focused_linear_attention(q, k, v, scale, heads, p, 1e-6, 1e-6,
                                                             None)
    assert out.dtype == dtype and out.shape == (b, n_q, ce) and state.dtype == torch.float32
    assert _relative(out, _reference(q, k, v, scale, heads, p)) < TOL[dtype]


@pytest.mark.parametrize('dtype', list(TOL), ids=lambda d: str(d).split('.')[-1])
def test_backward_matches_the_reference(dtype):
    b, n_q, n, c, ce, heads, p = 2, 70, 131, 72, 72, 3, 3
    inputs = _inputs(b, n_q, n, c, ce, dtype, seed=1)
    residual = torch.randn(b, ce, n_q, device=DEVICE, dtype=dtype).transpose(1, 2)
    grad = torch.randn(b, n_q, ce, device=DEVICE, dtype=dtype)
    leaves = [t.detach().requires_grad_() for t in inputs + [residual]]
    out, _ = torch.ops.mmeffvit.focused_linear_attention(*leaves[:4], heads, p, 1e-6, 1e-6,
                                                         leaves[4])
    out.backward(grad)
    ref_leaves = [t.detach().double().requires_grad_() for t in inputs + [residual]]
    _reference(*ref_leaves[:4], heads, p, ref_leaves[4]).backward(grad.double())
    for name, leaf, ref in zip(('q', 'k', 'v', 'scale', 'residual'), leaves, ref_leaves):
        assert leaf.grad.dtype == leaf.dtype and leaf.grad.shape == leaf.shape, name
        assert _relative(leaf.grad, ref.grad) < TOL[dtype] * 2, name


def test_strided_inputs_of_a_fused_projection():
    """q, k, v as thirds of one ``(B, N, 3C)`` projection and a transposed residual: read in
    place, the same result as contiguous copies."""
    qkv = torch.randn(2, 45, 3 * 48, device=DEVICE)
    scale = torch.randn(48, device=DEVICE)
    residual = torch.randn(2, 48, 45, device=DEVICE).transpose(1, 2)
    q, k, v = qkv.chunk(3, dim=-1)
    assert not q.is_contiguous() and not residual.is_contiguous()
    strided, _ = torch.ops.mmeffvit.focused_linear_attention(q, k, v, scale, 2, 3.0, 1e-6, 1e-6,
                                                             residual)
    dense, _ = torch.ops.mmeffvit.focused_linear_attention(
        q.contiguous(), k.contiguous(), v.contiguous(), scale, 2, 3.0, 1e-6, 1e-6,
        residual.contiguous())
    torch.testing.assert_close(strided, dense, rtol=0, atol=0)
    assert _relative(strided, _reference(q, k, v, scale, 2, 3, residual)) < TOL[torch.float32]


def test_ops_registered_with_fake_and_autograd():
    """``torch.library.opcheck``: schema, fake implementation, autograd registration and the
    AOT dispatcher, on both ops."""
    q, k, v, scale = _inputs(1, 40, 40, 32, 32, torch.float32, seed=2)
    residual = torch.randn(1, 40, 32, device=DEVICE)
    args = (q, k, v, scale, 2, 3.0, 1e-6, 1e-6, residual)
    torch.library.opcheck(torch.ops.mmeffvit.focused_linear_attention.default, args)
    grad_args = tuple(t.requires_grad_() if isinstance(t, torch.Tensor) else t for t in args)
    torch.library.opcheck(torch.ops.mmeffvit.focused_linear_attention.default, grad_args)
    _, state = torch.ops.mmeffvit.focused_linear_attention(*args)
    torch.library.opcheck(torch.ops.mmeffvit.focused_linear_attention_backward.default,
                          (torch.randn_like(residual), q.detach(), k.detach(), v.detach(),
                           scale.detach(), state.detach(), 2, 3.0, 1e-6, 1e-6))


class _OpNames(TorchDispatchMode):
    """The operators that launch work (the kernel counter's rule), by name, in order."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if not (func.is_view or name in NO_KERNEL or name.startswith('prim.')):
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def _entry_point_ops(*args, **kwargs):
    with _OpNames() as seen:
        out = focused_linear_attention(*args, **kwargs)
    return out, seen.names


def test_entry_point_selects_triton_only_when_asked():
    q, k, v, scale = _inputs(2, 50, 50, 32, 32, torch.float32, seed=3)
    residual = torch.randn(2, 50, 32, device=DEVICE)
    with ops.use_reference():
        expected = focused_linear_attention(q, k, v, scale, 2, residual=residual)
    with ops.use_kernels(required=False, triton=True):
        assert selected(q, k, v, scale) and not selected(q.double())
        out, names = _entry_point_ops(q, k, v, scale, 2, residual=residual)
    assert names == ['mmeffvit.focused_linear_attention']  # one op, nothing around it
    assert _relative(out, expected) < TOL[torch.float32]
    _, names = _entry_point_ops(q, k, v, scale, 2, residual=residual)
    assert 'mmeffvit.focused_linear_attention' not in names  # default policy: not selected
    with ops.use_kernels(required=False, triton=True), ops.use_reference():
        assert not selected(q, k, v, scale)


def test_fake_cuda_tensors_see_one_op_and_launch_nothing():
    """On fake CUDA tensors (the kernel counter's view) the entry point is the one custom op,
    its fake implementation giving shapes, no Triton launch and no GPU driver; the counter
    counts its launches: two passes, plus the partial states' sum above 256 keys."""
    for keys, launches in ((256, 2), (1024, 3)):
        with FakeTensorMode():
            q = torch.empty(2, 4096, 64, device='cuda', dtype=torch.bfloat16)
            kv = torch.empty(2, keys, 128, device='cuda', dtype=torch.bfloat16)
            scale = torch.empty(1, 1, 64, device='cuda')
            k, v = kv.chunk(2, dim=-1)
            assert runs_on(q, k, v, scale)
            with ops.use_kernels(required=False, triton=True), KernelCounter() as counter:
                out = focused_linear_attention(q, k, v, scale, 1, residual=torch.empty_like(q))
        assert dict(counter.count.by_op) == {'mmeffvit.focused_linear_attention': launches}
        assert counter.count.flops == 2 * 2 * (4096 + keys) * 64 * 64
        assert out.shape == (2, 4096, 64) and out.dtype == torch.bfloat16


def test_compiles_as_one_graph_with_the_op():
    q, k, v, scale = _inputs(1, 40, 40, 32, 32, torch.float32, seed=4)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, scale)]

    def attend(q, k, v, scale):
        return focused_linear_attention(q, k, v, scale, 2) * 2

    with ops.use_kernels(required=False, triton=True):
        compiled = torch.compile(attend, backend='aot_eager', fullgraph=True)
        compiled(*leaves).sum().backward()
        eager_grads = [t.grad.clone() for t in leaves]
        for t in leaves:
            t.grad = None
        attend(*leaves).sum().backward()
    for got, want in zip(eager_grads, (t.grad for t in leaves)):
        torch.testing.assert_close(got, want)


FLATTEN_BACKBONES = ['FLattenPVT', 'FLattenPVTv2', 'FLattenSwin', 'FLattenCSWin', 'FLattenDeiT']
# other Triton ops that must run in a family's step too
ALSO_RUN = {'FLattenCSWin': 'mmeffvit.stripe_attention_backward'}


@pytest.mark.parametrize('name', FLATTEN_BACKBONES)
def test_backbone_training_step_matches_the_reference(
        name, op='mmeffvit.focused_linear_attention_backward'):
    """A small backbone of each FLatten family (test_backbone_contract's), a training forward
    and backward at an odd size: outputs and every parameter gradient as under the
    references, with the focused linear attentions (and windowed, stripe attentions) on the
    Triton ops; ``op`` and the family's :data:`ALSO_RUN` must have run."""
    from test_backbone_contract import build
    torch.manual_seed(0)
    model = build(name).to(DEVICE).train()
    x = torch.randn(2, 3, 75, 107, device=DEVICE)
    results = []
    for block in (ops.use_reference(), ops.use_kernels(required=False, triton=True)):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        with block, _OpNames() as seen:
            outs = model(x)
            sum(((o.float() * (1 + i)).mean() for i, o in enumerate(outs))).backward()
        results.append(([o.detach() for o in outs],
                        {n: p.grad.clone() for n, p in model.named_parameters()
                         if p.grad is not None}, seen.names))
    (ref_outs, ref_grads, ref_ops), (outs, grads, names) = results
    assert not any(o.startswith('mmeffvit.') for o in ref_ops)
    assert op in names and ALSO_RUN.get(name, op) in names
    for a, b in zip(outs, ref_outs):
        assert _relative(a, b) < 1e-5
    assert grads.keys() == ref_grads.keys()
    for key in grads:
        torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-3, atol=1e-6,
                                   msg=lambda m: f'{key}: {m}')


def test_backbone_compiles_as_one_graph_with_the_op():
    """``torch.compile(fullgraph=True)`` over a FLatten backbone with the Triton op selected:
    one graph (no break), the op in it, outputs as in eager."""
    from test_backbone_contract import build
    torch.manual_seed(0)
    model = build('FLattenPVTv2').to(DEVICE).eval()
    x = torch.randn(1, 3, 64, 96, device=DEVICE)
    with ops.use_kernels(required=False, triton=True), torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
        eager = model(x)
        compiled = torch.compile(model, backend='eager', fullgraph=True)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    code = '\n'.join(g.code for g in explained.graphs)
    assert 'mmeffvit.focused_linear_attention' in code
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b)
