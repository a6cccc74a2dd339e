"""mmeffvit.ops.split_heads (issue 46): a fused projection's per-head views, whose backward
writes the parts' gradients over the projection where the caller owns it."""
import pytest
import torch

from mmeffvit import ops


def _plain(projected, parts, heads):
    """The layout spelt out: ``(B, N, parts, h, d)`` permuted to ``parts × (B, h, N, d)``."""
    b, n, c = projected.shape
    return projected.reshape(b, n, parts, heads, c // parts // heads).permute(2, 0, 3, 1, 4)


@pytest.mark.parametrize('owned', [False, True])
@pytest.mark.parametrize('parts, heads, dims', [(3, 2, 8), (2, 3, 5), (1, 1, 7)])
def test_values_and_gradients(owned, parts, heads, dims):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 11, 6, generator=g, requires_grad=True)
    weight = torch.randn(parts * heads * dims, 6, generator=g)
    projected = x @ weight.t()  # an intermediate only the caller holds
    views = ops.split_heads(projected, parts, heads, owned=owned)
    expected = _plain(projected.detach(), parts, heads)
    assert len(views) == parts
    for view, want in zip(views, expected):
        assert view.shape == (2, heads, 11, dims)
        torch.testing.assert_close(view, want, rtol=0, atol=0)
    grads = [torch.randn(v.shape, generator=g) for v in views]
    loss = sum((v * gr).sum() for v, gr in zip(views, grads))
    got, = torch.autograd.grad(loss, x)
    stacked = torch.stack(grads).permute(1, 3, 0, 2, 4).reshape(2, 11, -1)
    torch.testing.assert_close(got, stacked @ weight, rtol=1e-5, atol=1e-5)


def test_owned_backward_writes_over_the_projection_unless_the_graph_is_kept():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 4, generator=g, requires_grad=True)
    weight = torch.randn(12, 4, generator=g)
    projected = x @ weight.t()
    before = projected.detach().clone()
    q, k, v = ops.split_heads(projected, 3, 2, owned=True)
    first, = torch.autograd.grad((q * 2 + k - v).sum(), x, retain_graph=True)
    torch.testing.assert_close(projected.detach(), before)  # graph kept: left intact
    second, = torch.autograd.grad((q * 2 + k - v).sum(), x)
    torch.testing.assert_close(first, second)
    assert not torch.equal(projected.detach(), before)  # spent: the gradient took its memory


def test_not_owned_or_no_grad_is_the_plain_split():
    projected = torch.randn(2, 5, 12, requires_grad=True)
    views = ops.split_heads(projected * 1, 3, 2)
    assert views[0].grad_fn is not None and 'SplitHeadsOverSpent' not in type(
        views[0].grad_fn).__name__
    with torch.no_grad():
        for view, want in zip(ops.split_heads(projected, 3, 2, owned=True),
                              _plain(projected, 3, 2)):
            torch.testing.assert_close(view, want, rtol=0, atol=0)
