"""DepthwiseConv2d (channels-last brick, grouped weight gradient) and the token-grid resize."""
import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

from mmeffvit.models.layers import DepthwiseConv2d
from mmeffvit.models.layers import depthwise_conv
from mmeffvit.utils import TokenGridResizeCache, resize_token_grid


def _reference(conv, x_map, repeats=1):
    """torch's own depthwise conv on an NCHW-contiguous copy of the map."""
    weight, bias = conv.weight.repeat(repeats, 1, 1, 1), conv.bias.repeat(repeats)
    return F.conv2d(x_map.contiguous(), weight.contiguous(), bias, padding=conv.padding,
                    groups=weight.shape[0])


@pytest.mark.parametrize('kernel,channels,repeats', [(3, 6, 1), (5, 64, 1), (5, 32, 2),
                                                     ((7, 1), 64, 1), ((1, 11), 8, 1)])
@pytest.mark.parametrize('batch', [1, 2])
def test_tokens_forward_and_gradients_match_conv2d(kernel, channels, repeats, batch,
                                                   monkeypatch):
    # the grouped weight gradient is exercised on every case, small ones included
    monkeypatch.setattr(depthwise_conv, 'GROUPED_WEIGHT_GRAD_MIN_KERNEL', 1)
    monkeypatch.setattr(depthwise_conv, 'GROUPED_WEIGHT_GRAD_MIN_CHANNELS', 1)
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


def test_gradcheck_custom_weight_gradient(monkeypatch):
    monkeypatch.setattr(depthwise_conv, 'GROUPED_WEIGHT_GRAD_MIN_CHANNELS', 1)
    conv = DepthwiseConv2d(3, 5).double()
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64, requires_grad=True)
    assert conv._use_grouped_weight_grad(x, conv.weight)

    def fn(x, weight, bias):
        return depthwise_conv._DepthwiseConvFunction.apply(x, weight, bias, conv.padding)

    assert torch.autograd.gradcheck(fn, (x, conv.weight, conv.bias))


def test_map_input_and_checkpoint_names():
    conv = DepthwiseConv2d(4, 3)
    plain = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4)
    conv.load_state_dict(plain.state_dict())  # same names and shapes: checkpoints load unchanged
    assert isinstance(conv, torch.nn.Conv2d) and set(conv.state_dict()) == {'weight', 'bias'}
    x = torch.randn(2, 4, 5, 6)
    with torch.no_grad():
        torch.testing.assert_close(conv(x), plain(x))
        assert conv(x).is_contiguous(memory_format=torch.channels_last)


def test_channels_last_weight_strides():
    weight = torch.randn(8, 1, 5, 5)
    # .contiguous(memory_format=...) keeps NCHW strides for (C, 1, k, k); the helper must not
    assert weight.contiguous(memory_format=torch.channels_last).stride() == weight.stride()
    assert depthwise_conv.channels_last_weight(weight).stride() == (25, 1, 5, 1)


def test_bad_inputs_raise():
    conv = DepthwiseConv2d(4, 3)
    with pytest.raises(ValueError, match='tokens do not form'):
        conv(torch.randn(1, 10, 4), (3, 4))
    with pytest.raises(ValueError, match='channels'):
        conv(torch.randn(1, 12, 8), (3, 4))


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
