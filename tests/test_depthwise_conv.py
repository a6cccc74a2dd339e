"""DepthwiseConv2d (the nn.Conv2d brick over mmeffvit.ops.depthwise_conv, whose own tests are
tests/test_op_depthwise_conv.py), PVT v2's ConvMlp around it, and the token-grid resize."""
import copy
import importlib
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from mmeffvit.models.layers import DepthwiseConv2d
from mmeffvit.ops import depthwise_conv_weight_grad, depthwise_conv_weight_grad_ref, load_ext
from mmeffvit.ops.policy import ONEDNN_LINEAR
from mmeffvit.utils import TokenGridResizeCache, resize_token_grid

dw_ops = importlib.import_module('mmeffvit.ops.depthwise_conv')


def _reference(conv, x_map, repeats=1):
    """torch's own depthwise conv on an NCHW-contiguous copy of the map."""
    weight, bias = conv.weight.repeat(repeats, 1, 1, 1), conv.bias.repeat(repeats)
    return F.conv2d(x_map.contiguous(), weight.contiguous(), bias, padding=conv.padding,
                    groups=weight.shape[0])


@pytest.mark.parametrize('kernel,channels,repeats', [(3, 6, 1), (5, 64, 1), (5, 32, 2),
                                                     ((7, 1), 64, 1), ((1, 11), 8, 1)])
@pytest.mark.parametrize('batch', [1, 2])
@pytest.mark.parametrize('ops', ['compiled', 'reference'])
def test_tokens_forward_and_gradients_match_conv2d(kernel, channels, repeats, batch, ops,
                                                   monkeypatch, switch_kernels):
    # mmeffvit's weight gradient is exercised on every case, small ones included
    monkeypatch.setattr(dw_ops, 'CUSTOM_WEIGHT_GRAD_MIN_KERNEL', 1)
    monkeypatch.setattr(dw_ops, 'GROUPED_WEIGHT_GRAD_MIN_CHANNELS', 1)
    if ops == 'compiled' and load_ext() is None:
        pytest.skip('mmeffvit._ext not built')
    switch_kernels() if ops == 'compiled' else switch_kernels.reference()
    torch.manual_seed(0)
    conv = DepthwiseConv2d(channels, kernel).double()
    h, w = 9, 13
    c = channels * repeats
    tokens = torch.randn(batch, h * w, c, dtype=torch.float64, requires_grad=True)
    out = conv(tokens, (h, w), repeats=repeats)
    assert out.shape == (batch, h * w, c) and out.is_contiguous()
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (tokens, conv.weight, conv.bias), grad)

    x_map = tokens.transpose(1, 2).reshape(batch, c, h, w)
    ref = _reference(conv, x_map, repeats).flatten(2).transpose(1, 2)
    expected = torch.autograd.grad(ref, (tokens, conv.weight, conv.bias), grad)
    torch.testing.assert_close(out, ref)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_map_input_and_checkpoint_names():
    conv = DepthwiseConv2d(4, 3)
    plain = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4)
    conv.load_state_dict(plain.state_dict())  # same names and shapes: checkpoints load unchanged
    assert isinstance(conv, torch.nn.Conv2d) and set(conv.state_dict()) == {'weight', 'bias'}
    x = torch.randn(2, 4, 5, 6)
    with torch.no_grad():
        torch.testing.assert_close(conv(x), plain(x))
        assert conv(x).is_contiguous(memory_format=torch.channels_last)


def test_bad_inputs_raise():
    conv = DepthwiseConv2d(4, 3)
    with pytest.raises(ValueError, match='tokens do not form'):
        conv(torch.randn(1, 10, 4), (3, 4))
    with pytest.raises(ValueError, match='channels'):
        conv(torch.randn(1, 12, 8), (3, 4))


def _ops_called(fn):
    with profile() as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def _conv_mlp(seed=5, hidden=64):
    from mmeffvit.models.layers.pvt_block import ConvMlp
    torch.manual_seed(seed)
    return ConvMlp(16, hidden)


def _by_hand(mlp, x, hw):
    return mlp.fc2(F.gelu(mlp.dwconv(mlp.fc1(x), hw)))


@pytest.mark.skipif(not ONEDNN_LINEAR, reason='this torch has no oneDNN linear kernel')
def test_pvt_v2_conv_mlp_trains_gelu_and_fc2_as_one_function():
    """PVT v2's MLP (fc1 → depthwise conv → GELU → fc2): in training GELU and fc2 are one
    ``_GeluLinear``; output and gradients equal the modules composed by hand."""
    mlp = _conv_mlp().train()
    x = torch.randn(2, 6 * 7, 16, requires_grad=True)
    called = _ops_called(lambda: mlp(x, (6, 7)).sum().backward())
    assert '_GeluLinearBackward' in called and 'mkldnn::_convolution_pointwise' not in called
    out = mlp(x, (6, 7))
    expected = _by_hand(mlp, x, (6, 7))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    grad_out = torch.randn_like(out)
    inputs = [x] + list(mlp.parameters())
    for got, want in zip(torch.autograd.grad(out, inputs, grad_out),
                         torch.autograd.grad(expected, inputs, grad_out)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize('kernel', ['onednn', 'aten'])
def test_pvt_v2_conv_mlp_inference_equals_the_modules_by_hand(switch_kernels, kernel):
    """ConvMlp in inference runs conv and GELU as one ops.depthwise_conv call (fused into
    oneDNN's conv where the linears run oneDNN, test_op_depthwise_conv.py); the output equals
    the modules composed by hand on either GEMM."""
    if kernel == 'onednn' and not ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    switch_kernels(required=False, cpu_gemm=kernel)
    mlp = _conv_mlp(seed=6).eval()
    x = torch.randn(2, 9 * 11, 16)
    with torch.no_grad():
        called = _ops_called(lambda: mlp(x, (9, 11)))
        torch.testing.assert_close(mlp(x, (9, 11)), _by_hand(mlp, x, (9, 11)), rtol=1e-5,
                                   atol=1e-6)
    assert ('mkldnn::_convolution_pointwise' in called) == (
        kernel == 'onednn' and dw_ops._ONEDNN_CONV_POINTWISE)


@pytest.mark.parametrize('hooked', ['dwconv', 'dwconv.dwconv'])
@pytest.mark.parametrize('kernel', ['onednn', 'aten'])
def test_pvt_v2_conv_mlp_honours_hooks_on_its_conv(switch_kernels, kernel, hooked):
    """A forward hook on the conv (or its official ``dwconv.dwconv`` wrapper) sees the conv's
    own output, pre-GELU, as with the modules by hand: no fused call skips it."""
    if kernel == 'onednn' and not ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    switch_kernels(required=False, cpu_gemm=kernel)
    mlp = _conv_mlp(seed=8).eval()
    seen = []
    conv = mlp.get_submodule(hooked)
    conv.register_forward_hook(lambda m, args, out: seen.append(out))
    x = torch.randn(1, 5 * 6, 16)
    with torch.no_grad():
        out = mlp(x, (5, 6))
        conv_out = conv(mlp.fc1(x), (5, 6))
    assert len(seen) == 2  # the module's call, and the one above
    torch.testing.assert_close(seen[0], conv_out)
    torch.testing.assert_close(out, mlp.fc2(F.gelu(conv_out)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('mode', ['bilinear', 'bicubic', 'nearest'])
@pytest.mark.parametrize('src,dst', [((7, 7), (12, 17)), ((14, 14), (9, 5)), ((1, 1), (3, 4)),
                                     ((5, 3), (1, 1))])
def test_resize_token_grid_matches_interpolate(mode, src, dst):
    torch.manual_seed(0)
    tokens = torch.randn(1, src[0] * src[1], 6, dtype=torch.float64, requires_grad=True)
    got = resize_token_grid(tokens, src, dst, mode)
    grid = tokens.reshape(1, *src, 6).permute(0, 3, 1, 2)
    kwargs = {} if mode == 'nearest' else dict(align_corners=False)
    ref = F.interpolate(grid, size=dst, mode=mode, **kwargs).permute(0, 2, 3, 1).reshape(1, -1, 6)
    torch.testing.assert_close(got, ref)
    grad = torch.randn_like(ref)
    torch.testing.assert_close(torch.autograd.grad(got, tokens, grad)[0],
                               torch.autograd.grad(ref, tokens, grad)[0])
    assert resize_token_grid(tokens, src, src, mode) is tokens


def test_resize_cache_reuses_only_without_grad_and_tracks_updates():
    param = torch.nn.Parameter(torch.randn(1, 16, 3))
    cache = TokenGridResizeCache()
    first = cache(param, (4, 4), (6, 5))
    assert first.requires_grad and cache.value is None  # training: resized every call
    with torch.no_grad():
        a = cache(param, (4, 4), (6, 5))
        assert cache(param, (4, 4), (6, 5)) is a
        assert cache(param, (4, 4), (5, 5)) is not a  # another grid
        param.mul_(2)  # in-place update bumps the version
        b = cache(param, (4, 4), (5, 5))
        torch.testing.assert_close(b, resize_token_grid(param, (4, 4), (5, 5)))
    assert copy.deepcopy(cache).value is None and pickle.loads(pickle.dumps(cache)).key is None


needs_ext = pytest.mark.skipif(load_ext() is None, reason='mmeffvit._ext not built')


def _weight_grad_by_autograd(x, grad_out, kernel_size, padding):
    """float64 autograd of torch's depthwise conv on NCHW-contiguous copies (independent)."""
    x = x.detach().double().contiguous()
    weight = torch.zeros(x.shape[1], 1, *kernel_size, dtype=torch.float64, requires_grad=True)
    out = F.conv2d(x, weight, padding=padding, groups=x.shape[1])
    return torch.autograd.grad(out, weight, grad_out.double().contiguous())[0]


@needs_ext
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('batch,channels,hw,kernel,padding', [
    (1, 96, (20, 33), (5, 5), (2, 2)),    # FLatten's DWC
    (2, 40, (9, 13), (5, 5), (2, 2)),     # channels not a multiple of the register block
    (1, 8, (7, 6), (3, 3), (1, 1)),
    (3, 5, (6, 11), (7, 1), (3, 0)),      # one-sided kernels
    (1, 16, (5, 9), (4, 2), (1, 0)),      # even kernel: output smaller than the input
    (1, 12, (3, 4), (5, 5), (2, 2)),      # kernel larger than the map
])
def test_compiled_weight_grad_matches_autograd_on_token_views(dtype, batch, channels, hw,
                                                              kernel, padding, switch_kernels):
    switch_kernels()
    torch.manual_seed(0)
    h, w = hw
    # x is the v slice of a fused (B, H*W, 3C) projection: token stride 3C, read in place
    qkv = torch.randn(batch, h * w, 3 * channels, dtype=dtype)
    x = qkv[..., 2 * channels:].transpose(1, 2).reshape(batch, channels, h, w)
    ho, wo = h + 2 * padding[0] - kernel[0] + 1, w + 2 * padding[1] - kernel[1] + 1
    grad = torch.randn(batch, ho * wo, channels, dtype=dtype).transpose(1, 2).reshape(
        batch, channels, ho, wo)
    got = depthwise_conv_weight_grad(x, grad, kernel, padding)
    expected = _weight_grad_by_autograd(x, grad, kernel, padding)
    assert got.shape == (channels, 1, *kernel) and got.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got.double(), expected, **tol)
    # an NCHW-contiguous grad (converted inside) gives the same
    torch.testing.assert_close(depthwise_conv_weight_grad(x, grad.contiguous(), kernel, padding),
                               got, rtol=1e-6, atol=1e-6)
    ref = depthwise_conv_weight_grad_ref(x, grad, kernel, padding)
    torch.testing.assert_close(ref.double(), expected, **tol)


@needs_ext
def test_compiled_weight_grad_is_independent_of_the_thread_count():
    torch.manual_seed(0)
    x = torch.randn(1, 48, 37, 29).to(memory_format=torch.channels_last)
    grad = torch.randn(1, 48, 37, 29).to(memory_format=torch.channels_last)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(load_ext().depthwise_conv_weight_grad(x, grad, 5, 5, 2, 2))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(results[0], r) for r in results[1:])


@needs_ext
@pytest.mark.parametrize('case,message', [
    ('3d', 'expects \\(B, C, H, W\\)'),
    ('dtypes', 'float32 or float64'),
    ('grad shape', 'grad must be'),
    ('padding', 'bad kernel'),
])
def test_compiled_weight_grad_rejects_bad_arguments(case, message):
    ext = load_ext()
    x, grad = torch.randn(1, 4, 6, 6), torch.randn(1, 4, 6, 6)
    args = dict(kh=3, kw=3, ph=1, pw=1)
    if case == '3d':
        x = x[0]
    elif case == 'dtypes':
        grad = grad.double()
    elif case == 'grad shape':
        grad = grad[:, :, :5]
    else:
        args['ph'] = -1
    with pytest.raises(RuntimeError, match=message):
        ext.depthwise_conv_weight_grad(x, grad, **args)
