"""Kv-first linear attention as a Triton kernel (``mmeffvit::linear_attention``: L²ViT's
clamped sum with a per-head temperature, FLatten's mean form), against the PyTorch reference
in float64 (interpreted without a GPU, see test_triton_flatten.py)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from mmeffvit import ops
from mmeffvit.analysis.kernel_count import KernelCounter
from mmeffvit.ops import linear_attention_ref
from test_triton_flatten import DEVICE, TOL, _OpNames, _relative

pytest.importorskip('triton')

# (B, h, N, n, d, e, normaliser, temperature, clamp): every clamp regime (some rows clamped,
# none, all, a zero clamp), odd token counts, several partial states (300 keys), d != e
CASES = [(2, 3, 70, 70, 16, 16, 'sum', True, 5.), (1, 2, 33, 300, 24, 20, 'mean', False, 100.),
         (2, 1, 130, 9, 32, 32, 'sum', True, 1e4), (2, 2, 50, 50, 16, 16, 'sum', False, 0.)]


@pytest.mark.parametrize('dtype', list(TOL), ids=lambda d: str(d).split('.')[-1])
@pytest.mark.parametrize('case', CASES, ids=lambda c: f'{c[6]}-clamp{c[8]:g}-n{c[3]}')
def test_forward_and_backward_match_the_reference(case, dtype):
    b, h, n_q, n, d, e, normalizer, temp, clamp = case
    g = torch.Generator().manual_seed(0)
    # ReLU features, as the models give them; q as a per-head view of a token layout
    q = torch.rand(b, n_q, h, d, generator=g).transpose(1, 2)
    k, v = torch.rand(b, h, n, d, generator=g), torch.randn(b, h, n, e, generator=g)
    tau = torch.rand(h, 1, 1, generator=g) + 0.5 if temp else None
    inputs = [None if t is None else t.to(DEVICE, dtype if t is not tau else torch.float32)
              for t in (q, k, v, tau)]
    leaves = [None if t is None else t.detach().requires_grad_() for t in inputs]
    with ops.use_kernels(required=False, triton=True), _OpNames() as seen:
        out = ops.linear_attention(*leaves[:3], normalizer, temperature=leaves[3], clamp_min=clamp)
    assert 'mmeffvit.linear_attention' in seen.names and out.dtype == dtype
    grad = torch.randn(out.shape, generator=g).to(DEVICE, dtype)
    out.backward(grad)
    ref_leaves = [None if t is None else t.detach().double().requires_grad_() for t in inputs]
    ref = linear_attention_ref(*ref_leaves[:3], normalizer, temperature=ref_leaves[3],
                               clamp_min=clamp)
    ref.backward(grad.double())
    assert _relative(out, ref) < TOL[dtype]
    for name, leaf, want in zip(('q', 'k', 'v', 'temperature'), leaves, ref_leaves):
        if leaf is not None:
            assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype, name
            assert _relative(leaf.grad, want.grad) < TOL[dtype] * 2, name


@pytest.mark.slow
def test_ops_registered_with_fake_and_autograd():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.rand(1, 2, 40, 16, generator=g).to(DEVICE) for _ in range(3))
    tau = torch.rand(2, generator=g).to(DEVICE)
    torch.library.opcheck(torch.ops.mmeffvit.linear_attention.default,
                          (q.requires_grad_(), k, v, tau.requires_grad_(), 1, 1e-6, 3.0))
    out, state = torch.ops.mmeffvit.linear_attention(q.detach(), k, v, tau.detach(), 1, 1e-6,
                                                     3.0)
    torch.library.opcheck(torch.ops.mmeffvit.linear_attention_backward.default,
                          (torch.randn_like(out), q.detach(), k, v, tau.detach(), state, 1,
                           1e-6, 3.0))


def test_fake_cuda_is_two_launches():
    """L²ViT-T's stage-3 global attention at 800×1333 on fake CUDA tensors."""
    with FakeTensorMode():
        q, k, v = (torch.empty(2, 8, 50 * 84, 32, device='cuda') for _ in range(3))
        tau = torch.empty(8, 1, 1, device='cuda')
        with ops.use_kernels(required=False, triton=True), KernelCounter() as counter:
            out = ops.linear_attention(q, k, v, 'sum', temperature=tau)
    assert dict(counter.count.by_op) == {'mmeffvit.linear_attention': 3}  # + partial sums
    assert out.shape == (2, 8, 4200, 32)


@pytest.mark.parametrize('name', ['L2ViT', 'CARE'])
def test_backbone_training_step_matches_the_reference(name):
    """Small L²ViT (global clamped attention) and CARE backbones: a training step's outputs
    and gradients as under the references, the linear attentions on the Triton op."""
    from test_triton_flatten import test_backbone_training_step_matches_the_reference as check
    check(name, op='mmeffvit.linear_attention_backward')
