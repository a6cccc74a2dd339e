"""``mmeffvit/utils/tensor.py``: the token / head layout helpers the families share."""
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
