"""Stride-1 depthwise convolutions on channels-last (token) maps: the weight gradient, and the
3×3 conv with GELU of PVT v2's feed-forward in CPU inference."""
import torch
import torch.nn.functional as F

from .ext_loader import get_ext


def depthwise_conv_weight_grad_ref(x, grad_out, kernel_size, padding):
    """``dL/dw[c, 0, i, j] = Σ_{b,y,x} g[b, c, y, x] · x_pad[b, c, y+i, x+j]`` (stride 1) as one
    PyTorch conv with ``groups = C``: the input ``(1, C·B, H, W)`` (channel ``c·B + b``), padded by
    the conv, is correlated with the output gradient ``(C, B, Ho, Wo)`` used as kernel, which also
    sums the batch. The reference of :func:`depthwise_conv_weight_grad`, and its path where the
    compiled operator does not run.

    Args:
        x (Tensor): ``(B, C, H, W)`` input of the conv.
        grad_out (Tensor): ``(B, C, Ho, Wo)`` gradient of its output.
        kernel_size (tuple[int, int]): ``(kh, kw)``.
        padding (tuple[int, int]): ``(ph, pw)`` of the conv.

    Returns:
        Tensor: ``(C, 1, kh, kw)``.
    """
    b, c = x.shape[:2]
    xs = x.transpose(0, 1).reshape(1, c * b, *x.shape[2:])
    kernel = grad_out.transpose(0, 1)
    grad_w = F.conv2d(xs, kernel.to(xs.dtype), padding=tuple(padding), groups=c)
    return grad_w.reshape(c, 1, *kernel_size)


def compiled_weight_grad_applies(x):
    """Whether :func:`depthwise_conv_weight_grad` runs the compiled CPU operator on ``x``."""
    return (x.device.type == 'cpu' and x.dtype in (torch.float32, torch.float64)
            and get_ext(x) is not None)


def depthwise_conv_weight_grad(x, grad_out, kernel_size, padding):
    """Weight gradient of the stride-1 depthwise conv ``F.conv2d(x, w, padding=padding,
    groups=C)``: one pass over the channels-last maps on the CPU (``mmeffvit._ext``; views of
    ``(B, H*W, C)`` tokens with any token stride are read in place), else
    :func:`depthwise_conv_weight_grad_ref` (same arguments and result)."""
    if not compiled_weight_grad_applies(x) or grad_out.dtype != x.dtype:
        return depthwise_conv_weight_grad_ref(x, grad_out, kernel_size, padding)
    (kh, kw), (ph, pw) = kernel_size, padding
    return get_ext(x).depthwise_conv_weight_grad(x, grad_out, kh, kw, ph, pw)


def depthwise_conv3x3_gelu_ref(x, weight, bias, hw_shape):
    """``gelu(conv3x3(x) + bias)`` on ``(B, H*W, C)`` tokens (depthwise, stride 1, zero padding 1,
    exact GELU) with ``F.conv2d`` and ``F.gelu``: the reference of
    :func:`depthwise_conv3x3_gelu`."""
    b, n, c = x.shape
    x = x.transpose(1, 2).reshape(b, c, *hw_shape)
    return F.gelu(F.conv2d(x, weight, bias, padding=1, groups=c)).flatten(2).transpose(1, 2)


#: the compiled pass is used from this many elements (B·H·W·C) of the map on: below it (maps
#: that fit the caches, e.g. FLatten-PVTv2-B1's stage 4, 25 × 42 × 2048) oneDNN's fused conv
#: is the faster one
COMPILED_CONV3X3_GELU_MIN_ELEMENTS = 1 << 22


def compiled_conv3x3_gelu_applies(x):
    """Whether :func:`depthwise_conv3x3_gelu` runs the compiled pass on tokens ``x``."""
    return (x.device.type == 'cpu' and x.dtype == torch.float32 and x.dim() == 3
            and x.numel() >= COMPILED_CONV3X3_GELU_MIN_ELEMENTS and not torch.is_grad_enabled()
            and get_ext(x) is not None)


def depthwise_conv3x3_gelu(x, weight, bias, hw_shape):
    """``gelu(conv3x3(x) + bias)`` on ``(B, H*W, C)`` tokens, as PVT v2's ``ConvMlp`` runs its
    depthwise conv and GELU (sec. 3.3 of PVT v2): in CPU float32 inference one compiled pass
    over the map (``mmeffvit._ext``; on AVX-512 faster than oneDNN's conv with GELU fused on
    maps larger than the caches, ``docs/ops.md``), else
    :func:`depthwise_conv3x3_gelu_ref`. Returns contiguous ``(B, H*W, C)`` tokens.

    Args:
        x (Tensor): ``(B, H*W, C)`` tokens.
        weight (Tensor): ``(C, 1, 3, 3)``.
        bias (Tensor | None): ``C``.
        hw_shape (tuple[int, int]): ``(H, W)``.
    """
    if not compiled_conv3x3_gelu_applies(x):
        return depthwise_conv3x3_gelu_ref(x, weight, bias, hw_shape)
    return get_ext(x).depthwise_conv3x3_gelu(x, weight, bias, *hw_shape)
