"""mmeffvit.ops.linear, the CPU linears' entry point, on each GEMM the policy can choose
(issue 46): against float64 ``F.linear``, forward and backward, odd and strided inputs."""
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from mmeffvit import ops


def _operators(fn):
    with profile() as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def _inputs(shape, in_features, out_features, strided, bias, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if strided:  # a view with a stride in its last-but-one dimension
        x = torch.randn(*shape[:-1], 2 * shape[-1], in_features, generator=g)[..., ::2, :]
    else:
        x = torch.randn(*shape, in_features, generator=g)
    weight = torch.randn(out_features, in_features, generator=g) / in_features ** 0.5
    b = torch.randn(out_features, generator=g) if bias else None
    return x.to(dtype), weight.to(dtype), None if b is None else b.to(dtype)


@pytest.mark.parametrize('shape, in_features, out_features', [
    ((2, 37), 48, 72), ((1, 1), 3, 5), ((3, 7, 11), 17, 9), ((5,), 64, 64)])
@pytest.mark.parametrize('strided', [False, True])
@pytest.mark.parametrize('bias', [True, False])
def test_forward_and_backward_equal_float64(linear_gemm, shape, in_features, out_features,
                                            strided, bias):
    x, weight, b = _inputs(shape, in_features, out_features, strided, bias)
    expected = F.linear(x.double(), weight.double(), None if b is None else b.double())
    with torch.no_grad():
        torch.testing.assert_close(ops.linear(x, weight, b).double(), expected,
                                   rtol=1e-5, atol=1e-5)
    leaves = [t.clone().requires_grad_() for t in (x, weight) + ((b,) if bias else ())]
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    out = ops.linear(leaves[0], leaves[1], leaves[2] if bias else None)
    got = torch.autograd.grad(out, leaves, grad)
    want = torch.autograd.grad(
        F.linear(leaves64[0], leaves64[1], leaves64[2] if bias else None), leaves64,
        grad.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5)


def test_kernel_follows_the_policy(linear_gemm):
    x, weight, b = _inputs((4, 33), 40, 24, False, True)
    with torch.no_grad():
        called = _operators(lambda: ops.linear(x, weight, b))
    assert ('mkldnn::_linear_pointwise' in called) == (linear_gemm == 'onednn')


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float64])
def test_other_dtypes_run_torchs_linear(linear_gemm, dtype):
    x, weight, b = _inputs((3, 19), 24, 8, True, True, dtype=dtype)
    with torch.no_grad():
        called = _operators(lambda: ops.linear(x, weight, b))
        out = ops.linear(x, weight, b)
    assert 'mkldnn::_linear_pointwise' not in called
    assert out.dtype == dtype
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=0, atol=0)


def test_autocast_runs_torchs_linear(linear_gemm):
    x, weight, b = _inputs((3, 19), 24, 8, False, True)
    with torch.autocast('cpu', dtype=torch.bfloat16), torch.no_grad():
        called = _operators(lambda: ops.linear(x, weight, b))
        out = ops.linear(x, weight, b)
        expected = F.linear(x, weight, b)
    assert 'mkldnn::_linear_pointwise' not in called and out.dtype == expected.dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_empty_input(linear_gemm):
    x, weight, b = _inputs((0,), 16, 8, False, True)
    with torch.no_grad():
        assert ops.linear(x, weight, b).shape == (0, 8)
