"""``mmeffvit/utils/tensor.py``: the token / head layout helpers the families share."""
import pytest
import torch
from torch.profiler import profile

from mmeffvit.utils import split_heads


def test_split_heads_gives_the_permuted_views_and_a_copy_free_backward():
    """``split_heads`` returns the views of ``reshape(B, N, p, h, d).permute(2, 0, 3, 1, 4)``;
    its backward stacks the parts' gradients into the projection layout without a further
    copy, where the permuted form's backward copied them again (``aten::clone``)."""
    torch.manual_seed(6)
    qkv = torch.randn(2, 10, 3 * 12, requires_grad=True)
    parts = split_heads(qkv, 3, 4)
    permuted = qkv.reshape(2, 10, 3, 4, 3).permute(2, 0, 3, 1, 4)
    grads = [torch.randn(2, 4, 10, 3).transpose(2, 3).contiguous().transpose(2, 3)
             for _ in range(3)]  # strided, as attention kernels return them
    for got, want in zip(parts, permuted):
        assert got.shape == want.shape and got.stride() == want.stride()
        assert got.data_ptr() == want.data_ptr()

    def backward_ops(views):
        with profile() as prof:
            torch.autograd.backward(list(views), grads)
        return [e.name for e in prof.events()]
    ours = backward_ops(parts)
    assert 'aten::clone' not in ours and 'aten::stack' in ours
    mine = qkv.grad.clone()
    qkv.grad = None
    assert 'aten::clone' in backward_ops(permuted.unbind(0))
    torch.testing.assert_close(mine, qkv.grad, rtol=0, atol=0)


@pytest.mark.parametrize('shape,hw', [((2, 35 * 41, 24), (35, 41)), ((1, 7 * 9, 5), (7, 9)),
                                      ((3, 1 * 300, 2), (1, 300))])
def test_tokens_to_contiguous_map_equals_the_permuted_copy(monkeypatch, shape, hw):
    from mmeffvit.utils import tensor
    monkeypatch.setattr(tensor, '_TRANSPOSE_BLOCK_ELEMENTS', 64 * shape[2] + 7)  # ragged blocks
    tokens = torch.randn(shape)
    want = tokens.transpose(1, 2).reshape(shape[0], shape[2], *hw).contiguous()
    got = tensor.tokens_to_contiguous_map(tokens, hw)
    assert got.is_contiguous() and torch.equal(got, want)
    strided = torch.randn(shape[0], shape[1], 2 * shape[2])[..., ::2]  # not contiguous tokens
    assert torch.equal(tensor.tokens_to_contiguous_map(strided, hw),
                       strided.transpose(1, 2).reshape(shape[0], shape[2], *hw).contiguous())
    leaf = tokens.clone().requires_grad_()
    out = tensor.tokens_to_contiguous_map(leaf, hw)  # autograd: the plain copy
    out.backward(torch.ones_like(out))
    assert torch.equal(out, want) and torch.equal(leaf.grad, torch.ones_like(leaf))
