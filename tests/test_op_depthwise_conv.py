"""mmeffvit.ops.depthwise_conv (issue 46, step d) on every path the policy can take (the
reference, the kernels with oneDNN's or ATen's GEMM): against float64 ``F.conv2d`` (+ exact GELU)
on NCHW-contiguous copies, forward and backward, maps and token views, strided and odd-sized
inputs, fp32, fp64 and bf16."""
import importlib

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from mmeffvit import ops

dw_ops = importlib.import_module('mmeffvit.ops.depthwise_conv')


@pytest.fixture
def path(kernel_path):
    """The policy of the test (conftest's ``kernel_path``)."""
    return kernel_path


def _conv64(x_map, weight, bias, padding, act):
    """Depthwise conv (+ exact GELU) by torch on NCHW-contiguous float64 copies (differentiable
    in the float64 leaves given): the reference."""
    d = (lambda t: None if t is None else t.double().contiguous())
    out = F.conv2d(d(x_map), d(weight), d(bias), padding=padding, groups=weight.shape[0])
    return F.gelu(out) if act == 'gelu' else out


def _as_map(tokens, hw):
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], *hw)


def _token_input(b, c, hw, dtype, strided, seed=0):
    """``(B, H*W, C)`` tokens: contiguous, or the last third of a fused ``(B, H*W, 3C)``
    projection (token stride 3C, as FLatten's v)."""
    g = torch.Generator().manual_seed(seed)
    n = hw[0] * hw[1]
    if strided:
        return torch.randn(b, n, 3 * c, generator=g, dtype=dtype)[..., 2 * c:]
    return torch.randn(b, n, c, generator=g, dtype=dtype)


def _params(c, kernel, dtype, bias=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(c, 1, *kernel, generator=g, dtype=dtype) / (kernel[0] * kernel[1])
    return weight, (torch.randn(c, generator=g, dtype=dtype) if bias else None)


CASES = [  # channels, (H, W), kernel, padding
    (6, (9, 13), (3, 3), None),
    (64, (7, 6), (5, 5), None),      # FLatten's DWC: the compiled weight gradient
    (8, (5, 9), (7, 1), (3, 0)),     # one-sided kernels
    (5, (6, 11), (1, 11), None),
    (16, (5, 9), (4, 2), (1, 0)),    # even kernel: the output is smaller than the input
    (12, (3, 4), (5, 5), 2),         # kernel larger than the map
]


@pytest.mark.parametrize('channels, hw, kernel, padding', CASES)
@pytest.mark.parametrize('layout', ['tokens', 'strided tokens', 'map'])
@pytest.mark.parametrize('act', [None, 'gelu'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_forward_and_gradients_equal_float64(path, channels, hw, kernel, padding, layout, act,
                                             dtype, monkeypatch):
    # mmeffvit's weight gradient runs on every case where it may (small kernels included)
    monkeypatch.setattr(dw_ops, 'CUSTOM_WEIGHT_GRAD_MIN_KERNEL', 1)
    monkeypatch.setattr(dw_ops, 'GROUPED_WEIGHT_GRAD_MIN_CHANNELS', 1)
    calls = []
    weight_grad = dw_ops.depthwise_conv_weight_grad
    monkeypatch.setattr(dw_ops, 'depthwise_conv_weight_grad',
                        lambda *args: calls.append(1) or weight_grad(*args))
    tokens = _token_input(2, channels, hw, dtype, layout == 'strided tokens')
    x = _as_map(tokens, hw) if layout == 'map' else tokens
    weight, bias = _params(channels, kernel, dtype)
    leaves = [t.requires_grad_() for t in (x, weight, bias)]
    hw_arg = None if layout == 'map' else hw
    out = ops.depthwise_conv(x, weight, bias, hw_arg, padding, act)

    pad = padding if padding is not None else (kernel[0] // 2, kernel[1] // 2)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref = _conv64(leaves64[0] if hw_arg is None else _as_map(leaves64[0], hw), *leaves64[1:],
                  pad, act)
    if hw_arg is not None:
        ref = ref.flatten(2).transpose(1, 2)
        assert out.is_contiguous()  # the channels-last output's token view
    assert out.shape == ref.shape and out.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(out.detach().double(), ref.detach(), **tol)

    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=dtype)
    got = torch.autograd.grad(out, leaves, grad)
    want = torch.autograd.grad(ref, leaves64, grad.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, **tol)
    assert calls == [1]  # the weight gradient was mmeffvit's


def _ops_called(fn):
    with torch.no_grad(), profile() as prof:
        fn()
    return {e.key for e in prof.key_averages()}


@pytest.mark.parametrize('layout', ['tokens', 'map'])
def test_gelu_inference_fuses_into_onednns_conv_where_linears_run_onednn(path, layout):
    """CPU fp32 inference with ``act='gelu'``: one oneDNN conv + GELU call where the linears run
    oneDNN (the AVX-512 rule, forced here); with ATen's GEMM the two stay apart. The reference
    policy switches mmeffvit's compiled operators only and keeps the machine's GEMM. Under
    autograd never the fused call."""
    hw, c = (9, 11), 24
    x = _token_input(2, c, hw, torch.float32, strided=False)
    x = _as_map(x, hw) if layout == 'map' else x
    weight, bias = _params(c, (3, 3), torch.float32)
    hw_arg = hw if layout == 'tokens' else None
    with torch.no_grad():
        out = ops.depthwise_conv(x, weight, bias, hw_arg, act='gelu')
    ref = _conv64(_as_map(x, hw) if hw_arg else x, weight, bias, (1, 1), 'gelu')
    ref = ref.flatten(2).transpose(1, 2) if hw_arg else ref
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    fused = 'mkldnn::_convolution_pointwise' in _ops_called(
        lambda: ops.depthwise_conv(x, weight, bias, hw_arg, act='gelu'))
    gemm = {'onednn': 'onednn', 'aten': 'aten'}.get(path, ops.policy.policy().cpu_gemm)
    assert fused == (dw_ops._ONEDNN_CONV_POINTWISE and gemm == 'onednn')
    with profile() as prof:
        ops.depthwise_conv(x, weight.requires_grad_(), bias, hw_arg, act='gelu')
    assert 'mkldnn::_convolution_pointwise' not in {e.key for e in prof.key_averages()}


def test_gelu_inference_runs_the_compiled_conv3x3_gelu_on_large_token_maps(
        switch_kernels, monkeypatch):
    """Where conv and GELU fuse (oneDNN's linears, forced here), a 3×3 conv on a token map of
    at least COMPILED_CONV3X3_GELU_MIN_ELEMENTS (lowered to 0 here) runs mmeffvit's compiled
    pass instead of oneDNN's conv; maps and gradients never do."""
    if ops.load_ext() is None or not ops.policy.ONEDNN_LINEAR:
        pytest.skip('needs mmeffvit._ext and oneDNN linears')
    switch_kernels(required=False, cpu_gemm='onednn')
    monkeypatch.setattr(dw_ops, 'COMPILED_CONV3X3_GELU_MIN_ELEMENTS', 0)
    calls = []
    compiled = dw_ops.depthwise_conv3x3_gelu
    monkeypatch.setattr(dw_ops, 'depthwise_conv3x3_gelu',
                        lambda *args: calls.append(1) or compiled(*args))
    hw, c = (9, 11), 40
    x = _token_input(2, c, hw, torch.float32, strided=False)
    weight, bias = _params(c, (3, 3), torch.float32)
    with torch.no_grad():
        out = ops.depthwise_conv(x, weight, bias, hw, act='gelu')
        assert calls == [1]
        ops.depthwise_conv(_as_map(x, hw), weight, bias, act='gelu')  # a map: oneDNN's conv
        ops.depthwise_conv(x, weight, bias, hw, padding=0, act='gelu')  # not size-preserving
    assert calls == [1]
    ref = _conv64(_as_map(x, hw), weight, bias, (1, 1), 'gelu').flatten(2).transpose(1, 2)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    ops.depthwise_conv(x.requires_grad_(), weight, bias, hw, act='gelu')
    assert calls == [1]


@pytest.mark.parametrize('act', [None, 'gelu'])
def test_bfloat16_and_autocast_run_torchs_conv(path, act):
    """bf16 inputs, or fp32 under CPU autocast: torch's conv (no fused or compiled kernel),
    close to the float64 result at bf16 precision, gradients included."""
    hw, c = (7, 10), 32
    x = _token_input(1, c, hw, torch.float32, strided=True)
    weight, bias = _params(c, (5, 5), torch.float32)
    ref = _conv64(_as_map(x, hw), weight, bias, (2, 2), act).flatten(2).transpose(1, 2)
    leaves = [t.bfloat16().requires_grad_() for t in (x, weight, bias)]
    out = ops.depthwise_conv(*leaves, hw, act=act)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    out.sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 for t in leaves)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = ops.depthwise_conv(x, weight, bias, hw, act=act)
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize('args, message', [
    (dict(x=(1, 10, 4), hw_shape=(3, 4)), 'tokens do not form the grid'),
    (dict(x=(1, 12, 8), hw_shape=(3, 4)), 'channels'),
    (dict(x=(1, 4, 3, 4), act='relu'), "act must be None or 'gelu'"),
    (dict(x=(4, 3, 4)), 'expected a \\(B, C, H, W\\) map'),
    (dict(x=(1, 2, 4, 3, 4), hw_shape=(3, 4)), 'tokens must be'),
])
def test_bad_arguments_raise(args, message):
    weight = torch.randn(4, 1, 3, 3)
    x = torch.randn(*args.pop('x'))
    with pytest.raises(ValueError, match=message):
        ops.depthwise_conv(x, weight, None, **args)


def test_channels_last_weight_strides():
    weight = torch.randn(8, 1, 5, 5)
    # .contiguous(memory_format=...) keeps NCHW strides for (C, 1, k, k); the helper must not
    assert weight.contiguous(memory_format=torch.channels_last).stride() == weight.stride()
    assert dw_ops.channels_last_weight(weight).stride() == (25, 1, 5, 1)


def test_gradcheck_of_the_custom_weight_gradient(path, monkeypatch):
    monkeypatch.setattr(dw_ops, 'GROUPED_WEIGHT_GRAD_MIN_CHANNELS', 1)
    weight = torch.randn(3, 1, 5, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64, requires_grad=True)
    assert dw_ops._custom_weight_grad_applies(x, weight)

    def fn(x, weight, bias):
        return dw_ops._DepthwiseConvFunction.apply(x, weight, bias, (2, 2))

    assert torch.autograd.gradcheck(fn, (x, weight, bias))
