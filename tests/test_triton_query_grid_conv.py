"""LaViT's attention-residual conv over the query grid as a Triton kernel
(``mmeffvit::query_grid_conv``), against torch's conv2d in float64 (interpreted without a GPU,
see test_triton_flatten.py)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from mmeffvit import ops
from mmeffvit.analysis.kernel_count import KernelCounter
from test_op_query_grid_conv import _conv2d64
from test_triton_flatten import DEVICE, _OpNames, _relative

pytest.importorskip('triton')


SLOW = pytest.mark.slow  # the interpreter takes 3-20 s a case on 2 cores


@pytest.mark.parametrize('grid, kernel, stride, bias, dtype', [
    ((7, 9), 2, 2, True, torch.float32),
    pytest.param((7, 9), 3, 2, False, torch.float32, marks=SLOW),
    pytest.param((9, 4), 3, 3, True, torch.float32, marks=SLOW),
    pytest.param((5, 6), 1, 1, False, torch.float32, marks=SLOW),
    pytest.param((8, 8), 2, 2, True, torch.bfloat16, marks=SLOW)])
def test_forward_and_backward_match_conv2d(grid, kernel, stride, bias, dtype):
    """Odd grids (taps past the edge read zeros), kernels larger than the stride (inputs read
    by several outputs), scores as a strided view (keys-major storage)."""
    g = torch.Generator().manual_seed(0)
    attn = torch.randn(2, 3, 6, *grid, generator=g).permute(0, 1, 3, 4, 2).to(DEVICE, dtype)
    weight = torch.randn(4, 3, kernel, kernel, generator=g).to(DEVICE)
    b = torch.randn(4, generator=g).to(DEVICE) if bias else None
    out_hw = tuple(-(-s // stride) for s in grid)
    leaves = [t.detach().requires_grad_() for t in (attn, weight, b) if t is not None]
    with ops.use_kernels(required=False, triton=True), _OpNames() as seen:
        out = ops.query_grid_conv(leaves[0], leaves[1], leaves[2] if bias else None, stride,
                                  out_hw)
    assert seen.names == ['mmeffvit.query_grid_conv'] and out.dtype == dtype
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    want = _conv2d64(leaves64[0], leaves64[1], leaves64[2] if bias else None, stride, out_hw)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert _relative(out, want) < tol
    grad = torch.randn(out.shape, generator=g).to(DEVICE, dtype)
    for got, w in zip(torch.autograd.grad(out, leaves, grad),
                      torch.autograd.grad(want, leaves64, grad.double())):
        assert got.dtype == w.dtype or got.dtype in (dtype, torch.float32)
        assert _relative(got, w) < tol * 2


@SLOW
def test_ops_registered_with_fake_and_autograd():
    g = torch.Generator().manual_seed(1)
    attn = torch.randn(1, 2, 5, 3, 4, generator=g).to(DEVICE)
    weight = torch.randn(3, 2, 2, 2, generator=g).to(DEVICE)
    bias = torch.randn(3, generator=g).to(DEVICE)
    torch.library.opcheck(torch.ops.mmeffvit.query_grid_conv.default,
                          (attn, weight.requires_grad_(), bias.requires_grad_(), 2, 3, 2))
    grad = torch.randn(1, 3, 3, 2, 4, device=DEVICE)
    for needs in ((True, True, True), (False, True, False), (True, False, False)):
        torch.library.opcheck(torch.ops.mmeffvit.query_grid_conv_backward.default,
                              (grad, attn, weight.detach(), 2, 3, 2, *needs))


def test_fake_cuda_scores_are_one_launch():
    """LaViT-T's stage-1 residual at 800×1333 on fake CUDA tensors: one launch where the
    strided-slice sums launch ``k·k·in`` multiply-adds and a fill."""
    with FakeTensorMode():
        attn = torch.empty(2, 1, 200, 334, 1050, device='cuda', dtype=torch.bfloat16)
        weight = torch.empty(2, 1, 2, 2, device='cuda')
        bias = torch.empty(2, device='cuda')
        with ops.use_kernels(required=False, triton=True), KernelCounter() as counter:
            out = ops.query_grid_conv(attn, weight, bias, 2, (100, 167))
        with KernelCounter() as composite:
            ops.query_grid_conv(attn, weight, bias, 2, (100, 167))
    assert dict(counter.count.by_op) == {'mmeffvit.query_grid_conv': 1}
    assert out.shape == (2, 2, 100, 167, 1050)
    assert composite.count.kernels == 5  # the bias fill and four taps of one input head


def test_backbone_training_step_matches_the_reference():
    """A small LaViT backbone: a training step's outputs and gradients as under the
    references, with the attention-residual convs on the Triton op."""
    from test_triton_flatten import test_backbone_training_step_matches_the_reference as check
    check('LaViT', op='mmeffvit.query_grid_conv_backward')
