"""Stride-1 depthwise convolutions on channels-last (token) maps.

:func:`depthwise_conv` is the entry point: the conv (optionally followed by exact GELU) on a map
or on ``(B, H*W, C)`` tokens, choosing the kernel inside:

* the weight is handed to the conv with channels-last strides, so a channels-last input (the
  ``(B, C, H, W)`` view of tokens) is convolved without copies by oneDNN's NHWC kernel and the
  output's token view is contiguous (with NCHW weight strides oneDNN copies the input to NCHW
  and runs its slow NCHW depthwise kernel);
* on a CPU, in fp32/fp64 outside autocast, kernels of at least
  :data:`CUSTOM_WEIGHT_GRAD_MIN_KERNEL` get their weight gradient from
  :func:`depthwise_conv_weight_grad` (:class:`_DepthwiseConvFunction`), faster than oneDNN's;
* with ``act='gelu'`` in CPU fp32 inference where the linears run oneDNN (AVX-512), conv and
  GELU are one pass: mmeffvit's compiled 3×3 pass on large token maps
  (:func:`depthwise_conv3x3_gelu`), else oneDNN's conv with GELU fused; elsewhere the conv and
  ``F.gelu`` apart.

Measurements: ``docs/ops.md`` and ``docs/logs/profiles.md`` (causes 1 and 2).
"""
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .ext_loader import get_ext
from .linear import needs_grad, onednn_applies, onednn_gemm
from .policy import compiling

_ONEDNN_CONV_POINTWISE = (torch.backends.mkldnn.is_available()
                          and hasattr(torch.ops.mkldnn, '_convolution_pointwise'))

#: smallest kernel side for which mmeffvit's weight gradient replaces oneDNN's on a CPU
#: (the compiled operator is the faster one from k = 5; 3×3 kernels about equal, slower at
#: 8 channels; ``docs/ops.md``)
CUSTOM_WEIGHT_GRAD_MIN_KERNEL = 5
#: without the compiled operator, the grouped-conv formulation pays only from this many
#: channels (k = 5, 7 with 64-384 channels faster than oneDNN; 3x3 kernels and 8-channel maps
#: slower)
GROUPED_WEIGHT_GRAD_MIN_CHANNELS = 64


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


def channels_last_weight(weight):
    """``weight`` with channels-last strides ``(kh·kw, 1, kw, 1)``.

    ``weight.contiguous(memory_format=torch.channels_last)`` is a no-op for a ``(C, 1, k, k)``
    tensor (it already counts as channels-last contiguous) and oneDNN would still see NCHW
    strides; ``.to(memory_format=...)`` writes the strides that select the NHWC kernel.
    """
    return weight.to(memory_format=torch.channels_last)


def depthwise_conv_grads(x, grad_out, weight, padding, need_input, need_weight, need_bias):
    """Gradients ``(input, weight, bias)`` (None where not needed) of the stride-1 depthwise
    ``F.conv2d(x, weight, bias, padding=padding, groups=C)``: ATen's input gradient,
    :func:`depthwise_conv_weight_grad`, the bias sum. Every gradient is computed before this
    returns (callers may then overwrite ``x``)."""
    grad_x = grad_w = grad_b = None
    if need_input:
        grad_x = torch.ops.aten.convolution_backward(
            grad_out, x, weight, None, [1, 1], list(padding), [1, 1], False, [0, 0],
            weight.shape[0], [True, False, False])[0]
    if need_weight:
        grad_w = depthwise_conv_weight_grad(x, grad_out, tuple(weight.shape[2:]), tuple(padding))
    if need_bias:
        grad_b = grad_out.sum((0, 2, 3))
    return grad_x, grad_w, grad_b


class _DepthwiseConvFunction(torch.autograd.Function):
    """Stride-1 depthwise conv: ATen's (oneDNN's) forward and input gradient, mmeffvit's weight
    gradient (:func:`depthwise_conv_weight_grad`)."""

    @staticmethod
    def forward(ctx, x, weight, bias, padding):
        ctx.save_for_backward(x, weight)
        ctx.padding = padding
        ctx.has_bias = bias is not None
        return F.conv2d(x, weight, bias, padding=padding, groups=weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        return depthwise_conv_grads(x, grad_out, weight, ctx.padding, need_x, need_w,
                                    ctx.has_bias and need_b) + (None, )


def _custom_weight_grad_applies(x, weight):
    return (x.device.type == 'cpu' and max(weight.shape[2:]) >= CUSTOM_WEIGHT_GRAD_MIN_KERNEL
            and (x.shape[1] >= GROUPED_WEIGHT_GRAD_MIN_CHANNELS
                 or compiled_weight_grad_applies(x))
            and torch.is_grad_enabled() and weight.requires_grad
            and not torch.is_autocast_enabled('cpu')
            and x.dtype in (torch.float32, torch.float64) and x.dtype == weight.dtype
            and not compiling())


def _fused_gelu_applies(x, weight, bias):
    # on AVX2 (MKL's linears) the fused pass was the slower one (docs/ops.md)
    return (onednn_gemm() and _ONEDNN_CONV_POINTWISE and onednn_applies(x, weight)
            and not needs_grad(x, weight, bias))


def _token_map(x, hw_shape):
    if x.dim() != 3:
        raise ValueError(f'tokens must be (B, H*W, C), got shape {tuple(x.shape)}')
    b, n, c = x.shape
    if len(hw_shape) != 2 or n != hw_shape[0] * hw_shape[1]:
        raise ValueError(f'{n} tokens do not form the grid {tuple(hw_shape)}')
    return x.transpose(1, 2).reshape(b, c, *hw_shape)


def depthwise_conv(x, weight, bias=None, hw_shape=None, padding=None, act=None):
    """``act(F.conv2d(x, weight, bias, padding=padding, groups=C))``: a stride-1 depthwise conv
    on a map or on tokens, the kernel chosen inside (see the module).

    Args:
        x (Tensor): A map ``(B, C, H, W)``, or tokens ``(B, H*W, C)`` with ``hw_shape``.
        weight (Tensor): ``(C, 1, kh, kw)``.
        bias (Tensor | None): ``C``.
        hw_shape (tuple[int, int], optional): ``(H, W)`` of token input.
        padding (int | tuple[int, int], optional): Default ``(kh // 2, kw // 2)``.
        act (str, optional): None or ``'gelu'`` (exact GELU after the conv).

    Returns:
        Tensor: the input's layout, ``(B, C, Ho, Wo)`` (channels-last) or contiguous
        ``(B, Ho*Wo, C)`` tokens.
    """
    if act not in (None, 'gelu'):
        raise ValueError(f"act must be None or 'gelu', got {act!r}")
    tokens = hw_shape is not None
    x_map = _token_map(x, hw_shape) if tokens else x
    if x_map.dim() != 4:
        raise ValueError(f'expected a (B, C, H, W) map, got shape {tuple(x.shape)}')
    if weight.dim() != 4 or weight.shape[1] != 1 or x_map.shape[1] != weight.shape[0]:
        raise ValueError(f'input has {x_map.shape[1]} channels, a depthwise weight for them is '
                         f'({x_map.shape[1]}, 1, kh, kw), got {tuple(weight.shape)}')
    kernel = tuple(weight.shape[2:])
    if padding is None:
        padding = (kernel[0] // 2, kernel[1] // 2)
    elif isinstance(padding, int):
        padding = (padding, padding)
    padding = tuple(padding)
    channels = weight.shape[0]
    if act == 'gelu' and _fused_gelu_applies(x, weight, bias):
        if (tokens and kernel == (3, 3) and padding == (1, 1)
                and compiled_conv3x3_gelu_applies(x)):
            return depthwise_conv3x3_gelu(x, weight, bias, hw_shape)
        out = torch.ops.mkldnn._convolution_pointwise(
            x_map, channels_last_weight(weight), bias, list(padding), [1, 1], [1, 1], channels,
            'gelu', [], 'none')
    else:
        weight = channels_last_weight(weight)
        if _custom_weight_grad_applies(x_map, weight):
            out = _DepthwiseConvFunction.apply(x_map, weight, bias, padding)
        else:
            out = F.conv2d(x_map, weight, bias, padding=padding, groups=channels)
        if act == 'gelu':
            out = F.gelu(out)
    return out.flatten(2).transpose(1, 2) if tokens else out
