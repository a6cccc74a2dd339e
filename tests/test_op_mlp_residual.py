"""mmeffvit.ops.mlp_residual (issue 46): ``x + fc2(gelu(fc1(layer_norm(x))))`` on each GEMM the
policy can choose and under the reference policy, against the float64 composition of torch's
operators: in place by row blocks where it may, out of place elsewhere, under autograd, autocast
and on odd and strided inputs."""
import importlib

import pytest
import torch
import torch.nn.functional as F

from mmeffvit import ops

ops_linear = importlib.import_module('mmeffvit.ops.linear')  # ops.linear: the function


@pytest.fixture
def path(kernel_path):
    """The policy of the test (conftest's ``kernel_path``)."""
    return kernel_path


def _case(tokens=300, dims=24, hidden=96, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(2, tokens, dims, generator=g, dtype=dtype)
    params = [torch.empty(dims, dtype=dtype).uniform_(0.5, 1.5, generator=g),   # norm weight
              torch.empty(dims, dtype=dtype).uniform_(-0.5, 0.5, generator=g),  # norm bias
              torch.randn(hidden, dims, generator=g, dtype=dtype) / dims ** 0.5,
              torch.randn(hidden, generator=g, dtype=dtype),
              torch.randn(dims, hidden, generator=g, dtype=dtype) / hidden ** 0.5,
              torch.randn(dims, generator=g, dtype=dtype)]
    return x, params


def _residual64(x, nw, nb, w1, b1, w2, b2, eps=1e-6):
    x, nw, nb, w1, b1, w2, b2 = (t.double() for t in (x, nw, nb, w1, b1, w2, b2))
    return x + F.linear(F.gelu(F.linear(F.layer_norm(x, x.shape[-1:], nw, nb, eps), w1, b1)),
                        w2, b2)


@pytest.mark.parametrize('blocked', [True, False])
@pytest.mark.parametrize('rank', [3, 4])
def test_inference_equals_float64_in_place_by_row_blocks_where_it_may(path, blocked, rank,
                                                                      monkeypatch):
    x, params = _case()
    x = x.view(2, 20, 15, 24) if rank == 4 else x
    monkeypatch.setattr(ops_linear, '_MLP_BLOCKED_MIN_ELEMENTS', 1000 if blocked else 10 ** 9)
    monkeypatch.setattr(ops_linear, '_MLP_BLOCK_ELEMENTS', 96 * 128)  # 128 rows per block
    rows_seen = []
    fused = ops_linear.fused_linear
    monkeypatch.setattr(ops_linear, 'fused_linear', lambda inp, *args: rows_seen.append(
        inp.shape[0]) or fused(inp, *args))
    expected = _residual64(x, *params)
    owned = x.clone()
    with torch.no_grad():
        out = ops.mlp_residual(owned, *params, norm_eps=1e-6, owned=True)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    # the linears always run the fused kernel here (oneDNN's, or ATen's with the bias fused)
    in_blocks = blocked and ops.policy.ONEDNN_LINEAR
    assert (out is owned) == in_blocks
    if in_blocks:  # 600 rows: blocks of 128, 128, 128, 128, 88, each through fc1 and fc2
        assert rows_seen == [128, 128, 128, 128, 128, 128, 128, 128, 88, 88]
    else:
        assert torch.equal(owned, x)  # the input untouched


@pytest.mark.parametrize('case', ['not owned', 'grad', 'strided', 'float64'])
def test_out_of_place_where_blocks_do_not_apply(path, case, monkeypatch):
    monkeypatch.setattr(ops_linear, '_MLP_BLOCKED_MIN_ELEMENTS', 1000)
    x, params = _case(dtype=torch.float64 if case == 'float64' else torch.float32)
    if case == 'strided':
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    if case == 'grad':
        params = [p.requires_grad_() for p in params]
    x_before = x.clone()
    with torch.set_grad_enabled(case == 'grad'):
        out = ops.mlp_residual(x, *params, norm_eps=1e-6, owned=case != 'not owned')
    assert out is not x and torch.equal(x, x_before)
    torch.testing.assert_close(out.double(), _residual64(x, *params),
                               rtol=1e-5, atol=1e-5)
    if case == 'grad':
        leaves64 = [p.detach().double().requires_grad_() for p in params]
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        got = torch.autograd.grad(out, params, grad)
        want = torch.autograd.grad(_residual64(x, *leaves64), leaves64, grad.double())
        for g, w in zip(got, want):
            torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('norm_fp32', [False, True])
def test_autocast_runs_the_norm_in_fp32_with_norm_fp32(path, norm_fp32):
    """Under CPU autocast (bf16) on a bf16 residual stream the fused kernels never apply; with
    ``norm_fp32`` the LayerNorm runs in fp32 (``LayerNormFP32``'s rule), without it in bf16
    (autocast's own, whose norm-weight gradient sums over the tokens in bf16): output and
    gradients equal that composition of torch's operators exactly, not the other one."""
    x, params = _case(tokens=1000)
    x = x.bfloat16()
    params = [p.requires_grad_() for p in params]
    nw, nb, w1, b1, w2, b2 = params

    def composed(fp32):
        with torch.autocast('cpu', enabled=not fp32, dtype=torch.bfloat16):
            normed = F.layer_norm(x.float() if fp32 else x, x.shape[-1:], nw, nb, 1e-6)
        return x + F.linear(F.gelu(F.linear(normed, w1, b1)), w2, b2)

    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).bfloat16()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = ops.mlp_residual(x, *params, norm_eps=1e-6, owned=True, norm_fp32=norm_fp32)
        expected, other = composed(norm_fp32), composed(not norm_fp32)
    assert torch.equal(out, expected)
    got, want, not_want = (torch.autograd.grad(y, (nw, nb), grad)
                           for y in (out, expected, other))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not all(torch.equal(g, w) for g, w in zip(got, not_want))
