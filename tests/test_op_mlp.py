"""mmeffvit.ops.mlp and mmeffvit.ops.gelu_linear (issue 46) on each GEMM the policy can choose,
in inference and under autograd: against the float64 composition of ``F.linear`` and exact
GELU, forward and backward, odd and strided inputs."""
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from mmeffvit import ops


def _weights(dims, hidden, out, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(hidden, dims, generator=g) / dims ** 0.5
    w2 = torch.randn(out, hidden, generator=g) / hidden ** 0.5
    b1 = torch.randn(hidden, generator=g) if bias else None
    b2 = torch.randn(out, generator=g) if bias else None
    return w1, b1, w2, b2


def _tokens(shape, dims, strided, seed=1):
    g = torch.Generator().manual_seed(seed)
    if strided:
        return torch.randn(*shape[:-1], 2 * shape[-1], dims, generator=g)[..., 1::2, :]
    return torch.randn(*shape, dims, generator=g)


def _mlp64(x, w1, b1, w2, b2):
    d = (lambda t: None if t is None else t.double())
    return F.linear(F.gelu(F.linear(x.double(), d(w1), d(b1))), d(w2), d(b2))


@pytest.mark.parametrize('shape, dims, hidden, out',
                         [((2, 37), 24, 96, 24), ((1, 1), 3, 7, 5), ((3, 5, 9), 16, 64, 8)])
@pytest.mark.parametrize('strided', [False, True])
@pytest.mark.parametrize('bias', [True, False])
def test_mlp_inference_equals_float64(linear_gemm, shape, dims, hidden, out, strided,
                                      bias):
    w1, b1, w2, b2 = _weights(dims, hidden, out, bias=bias)
    x = _tokens(shape, dims, strided)
    with torch.no_grad():
        got = ops.mlp(x, w1, b1, w2, b2)
        with profile() as prof:
            ops.mlp(x, w1, b1, w2, b2)
    torch.testing.assert_close(got.double(), _mlp64(x, w1, b1, w2, b2), rtol=1e-5, atol=1e-5)
    called = {e.key for e in prof.key_averages()}
    # fc1 + GELU one oneDNN call where the linears run oneDNN; GELU apart on ATen's GEMM
    assert ('mkldnn::_linear_pointwise' in called) == (linear_gemm == 'onednn')


@pytest.mark.parametrize('shape, dims, hidden, out',
                         [((2, 37), 24, 96, 24), ((3, 5, 9), 16, 64, 8)])
@pytest.mark.parametrize('strided', [False, True])
def test_mlp_training_gradients_equal_float64(linear_gemm, shape, dims, hidden, out,
                                              strided):
    leaves = [t.requires_grad_() for t in _weights(dims, hidden, out)]
    x = _tokens(shape, dims, strided).requires_grad_()
    y = ops.mlp(x, *leaves)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad(y, [x] + leaves, grad)
    leaves64 = [t.detach().double().requires_grad_() for t in [x] + leaves]
    want = torch.autograd.grad(_mlp64(*leaves64), leaves64, grad.double())
    torch.testing.assert_close(y.detach().double(), _mlp64(x, *leaves).detach(), rtol=1e-5,
                               atol=1e-5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('owned', [False, True])
def test_gelu_linear_equals_float64(linear_gemm, owned):
    g = torch.Generator().manual_seed(4)
    base = torch.randn(2, 45, 32, generator=g, requires_grad=True)
    weight = torch.randn(12, 32, generator=g, requires_grad=True)
    bias = torch.randn(12, generator=g, requires_grad=True)
    hidden = base * 1.5  # an intermediate the caller owns
    leaves64 = [t.detach().double().requires_grad_() for t in (base, weight, bias)]
    ref = F.linear(F.gelu(leaves64[0] * 1.5), leaves64[1], leaves64[2])
    with torch.no_grad():
        torch.testing.assert_close(ops.gelu_linear(hidden, weight, bias).double(),
                                   ref.detach(), rtol=1e-5, atol=1e-5)
    out = ops.gelu_linear(hidden, weight, bias, owned=owned)
    grad = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, [base, weight, bias], grad)
    want = torch.autograd.grad(ref, leaves64, grad.double())
    torch.testing.assert_close(out.detach().double(), ref.detach(), rtol=1e-5, atol=1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


def test_other_dtypes_compose_torchs_operators(linear_gemm):
    w1, b1, w2, b2 = (t.bfloat16() for t in _weights(16, 32, 8))
    x = _tokens((2, 9), 16, True).bfloat16()
    with torch.no_grad():
        got = ops.mlp(x, w1, b1, w2, b2)
    expected = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
