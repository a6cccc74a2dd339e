"""mmeffvit.ops.query_grid_conv (issue 47, step d): LaViT's folded attention-residual conv over
a score map's query grid, against its float64 reference (zero-padded einsum taps) and torch's
conv2d with the keys as batch: forward, backward, odd grids, kernels other than the stride."""
import pytest
import torch
import torch.nn.functional as F

from mmeffvit import ops


def _conv2d64(attn, weight, bias, stride, out_hw):
    """torch's conv2d on ``(B·Nk, in, Hq, Wq)`` maps zero-padded at the bottom/right."""
    b, h, hq, wq, nk = attn.shape
    k = weight.shape[-1]
    maps = attn.double().permute(0, 4, 1, 2, 3).reshape(b * nk, h, hq, wq)
    pad = [max((n - 1) * stride + k - m, 0) for m, n in zip((hq, wq), out_hw)]
    maps = F.pad(maps, (0, pad[1], 0, pad[0]))
    out = F.conv2d(maps, weight.double(), None if bias is None else bias.double(), stride)
    out = out[..., :out_hw[0], :out_hw[1]]
    return out.reshape(b, nk, -1, *out_hw).permute(0, 2, 3, 4, 1)


@pytest.mark.parametrize('grid, kernel, stride', [((7, 9), 2, 2), ((8, 8), 2, 2),
                                                  ((7, 9), 3, 2), ((5, 6), 1, 1),
                                                  ((1, 3), 2, 2), ((9, 4), 3, 3)])
@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_query_grid_conv_equals_conv2d_forward_and_backward(grid, kernel, stride, bias, dtype):
    g = torch.Generator().manual_seed(0)
    attn = torch.randn(2, 3, *grid, 6, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(4, 3, kernel, kernel, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(4, generator=g, dtype=dtype, requires_grad=True) if bias else None
    out_hw = tuple(-(-s // stride) for s in grid)
    out = ops.query_grid_conv(attn, weight, b, stride, out_hw)
    leaves = [attn, weight] + ([b] if bias else [])
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    want = _conv2d64(leaves64[0], leaves64[1], leaves64[2] if bias else None, stride, out_hw)
    assert out.shape == want.shape and out.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(out.double(), want.detach(), **tol)
    ref = ops.query_grid_conv_reference(*leaves64[:2], stride, out_hw,
                                        leaves64[2] if bias else None)
    torch.testing.assert_close(ref, want)
    grad = torch.randn(out.shape, generator=g, dtype=dtype)
    for got, w in zip(torch.autograd.grad(out, leaves, grad),
                      torch.autograd.grad(want, leaves64, grad.double())):
        torch.testing.assert_close(got.double(), w, **tol)


def test_query_grid_conv_gradcheck():
    g = torch.Generator().manual_seed(1)
    attn = torch.randn(1, 2, 5, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 2, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w, b: ops.query_grid_conv(a, w, b, 2, (3, 2)),
                                    (attn, weight, bias))


def test_query_grid_conv_rejects_mismatched_shapes():
    """Checked before any path: a weight whose input heads are not the scores' would be read
    out of bounds by the Triton kernel."""
    attn, weight = torch.randn(1, 2, 4, 4, 3), torch.randn(3, 2, 2, 2)
    for args, message in [((attn, weight[:, :1]), 'square'), ((attn[0], weight), 'scores'),
                          ((attn, weight[..., :1]), 'square')]:
        with pytest.raises(ValueError, match=message):
            ops.query_grid_conv(*args, None, 2, (2, 2))
    with pytest.raises(ValueError, match='bias must have shape'):
        ops.query_grid_conv(attn, weight, torch.zeros(2), 2, (2, 2))
