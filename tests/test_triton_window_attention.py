"""Softmax attention in windows as a Triton kernel (``mmeffvit::window_attention``), against
``F.scaled_dot_product_attention`` in float64 (interpreted without a GPU, see
test_triton_flatten.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from mmeffvit import ops
from mmeffvit.analysis.kernel_count import KernelCounter
from test_triton_flatten import DEVICE, TOL, _OpNames, _relative

pytest.importorskip('triton')

# (windows, heads, tokens, head dims, bias (windows, heads) or None, mask (windows, heads) or
# None): 7×7 windows with Swin's shared bias and per-window shift mask, 12×12 windows with a
# per-window bias, an odd window without bias (L²ViT), heads of 24 channels
CASES = [(6, 3, 49, 32, (1, 3), (6, 1)), (4, 2, 144, 24, (4, 2), None),
         (3, 1, 10, 16, None, (1, 1)), (5, 2, 49, 24, None, None)]


def _case(windows, heads, n, d, bias_shape, mask_shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # q, k, v as Swin gets them: per-head views of one (windows, n, 3, h, d) projection
    qkv = torch.randn(windows, n, 3, heads, d, generator=g).to(DEVICE, dtype)
    qkv = qkv.permute(2, 0, 3, 1, 4)
    bias = None if bias_shape is None else torch.randn(*bias_shape, n, n, generator=g)
    mask = None
    if mask_shape is not None:
        mask = (torch.rand(*mask_shape, n, n, generator=g) < 0.3) * -100.0
    move = (lambda t: None if t is None else t.to(DEVICE, dtype))
    return [qkv[0], qkv[1], qkv[2], move(bias), move(mask)]


def _reference(q, k, v, bias, mask, scale):
    terms = [t.double() for t in (bias, mask) if t is not None]
    attn_mask = sum(terms) if terms else None
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=attn_mask,
                                          scale=scale).transpose(1, 2)


@pytest.mark.parametrize('dtype', list(TOL), ids=lambda d: str(d).split('.')[-1])
@pytest.mark.parametrize('case', CASES, ids=lambda c: f'{c[0]}x{c[1]}x{c[2]}x{c[3]}')
def test_forward_and_backward_match_the_reference(case, dtype):
    q, k, v, bias, mask = _case(*case, dtype)
    assert not q.is_contiguous()
    scale = case[3] ** -0.5
    leaves = [None if t is None else t.detach().requires_grad_() for t in (q, k, v, bias)]
    out, lse = torch.ops.mmeffvit.window_attention(*leaves, mask, scale)
    assert out.shape == (case[0], case[2], case[1], case[3]) and out.dtype == dtype
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_leaves = [None if t is None else t.detach().double().requires_grad_()
                  for t in (q, k, v, bias)]
    ref = _reference(*ref_leaves, mask, scale)
    ref.backward(grad.double())
    assert _relative(out, ref) < TOL[dtype]
    for name, leaf, want in zip('qkvb', leaves, ref_leaves):
        if leaf is not None:
            assert leaf.grad.dtype == leaf.dtype and leaf.grad.shape == leaf.shape, name
            assert _relative(leaf.grad, want.grad) < TOL[dtype] * 2, name


def test_ops_registered_with_fake_and_autograd():
    q, k, v, bias, mask = _case(*CASES[0], torch.float32, seed=1)
    args = (q, k, v, bias.requires_grad_(), mask, 0.2)
    torch.library.opcheck(torch.ops.mmeffvit.window_attention.default, args)
    out, lse = torch.ops.mmeffvit.window_attention(q, k, v, bias.detach(), mask, 0.2)
    for bias_grad in (True, False):
        torch.library.opcheck(torch.ops.mmeffvit.window_attention_backward.default,
                              (torch.randn_like(out), q, k, v, bias.detach(), mask, out, lse, 0.2,
                               bias_grad))


def test_entry_point_selects_triton_only_when_it_applies():
    q, k, v, bias, mask = _case(*CASES[0], torch.float32, seed=2)
    with ops.use_reference():
        expected = ops.window_attention(q, k, v, mask, bias=bias)
    with ops.use_kernels(required=False, triton=True):
        with _OpNames() as seen:
            out = ops.window_attention(q, k, v, mask, bias=bias)
        assert seen.names == ['mmeffvit.window_attention']
        assert _relative(out, expected) < TOL[torch.float32]
        # not taken: dropout, a mis-sized bias, fewer keys than queries (SDPA's case)
        for kwargs in (dict(dropout=0.1), dict(bias=bias[..., :-1, :-1])):
            with _OpNames() as seen:
                try:
                    ops.window_attention(q, k, v, None, **kwargs)
                except RuntimeError:  # the mis-sized bias fails in SDPA, as it should
                    pass
            assert 'mmeffvit.window_attention' not in seen.names
        with _OpNames() as seen:
            fewer = ops.window_attention(q, k[:, :, :20], v[:, :, :20])
        assert 'mmeffvit.window_attention' not in seen.names and fewer.shape[1] == q.shape[2]


def test_fake_cuda_windows_are_one_launch_each_way():
    """The kernel counter's view of FLatten-Swin's stage-1 windows at 800×1333 (bf16): one
    launch forward; the training forward records the op for the backward."""
    with FakeTensorMode():
        qkv = torch.empty(2 * 29 * 48, 49, 3, 3, 32, device='cuda', dtype=torch.bfloat16)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        bias = torch.empty(1, 3, 49, 49, device='cuda', dtype=torch.bfloat16)
        mask = torch.empty(2 * 29 * 48, 1, 49, 49, device='cuda', dtype=torch.bfloat16)
        with ops.use_kernels(required=False, triton=True), KernelCounter() as counter:
            out = ops.window_attention(q, k, v, mask, bias=bias)
    assert dict(counter.count.by_op) == {'mmeffvit.window_attention': 1}
    assert out.shape == (2 * 29 * 48, 49, 3, 32)


@pytest.mark.parametrize('name', ['FLattenSwin', 'L2ViT'])
def test_backbone_training_step_matches_the_reference(name):
    """Small FLatten-Swin (shifted 7×7 windows, trained bias) and L²ViT (windows without bias)
    backbones: a training step's outputs and gradients as under the references."""
    from test_triton_flatten import test_backbone_training_step_matches_the_reference as check
    check(name, op='mmeffvit.window_attention_backward')
