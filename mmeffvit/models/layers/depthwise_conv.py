"""Depthwise convolution on token maps, in the channels-last layout the tokens already have.

Every family here runs depthwise convs on maps that are views of ``(B, H*W, C)`` tokens, i.e.
channels-last memory. With the default ``(C, 1, k, k)`` weight strides oneDNN copies such an
input to NCHW, runs its slow NCHW depthwise kernel and returns NCHW, which the next token op
copies back; with channels-last weight strides it runs the vectorised NHWC kernel on the view and
returns a map whose token view is contiguous. For kernels of 5 and more oneDNN's weight gradient
is also slow on a CPU; it is computed here by mmeffvit's compiled operator (one pass over the
token maps, read in place), or without it as one grouped conv. Measurements:
``docs/logs/profiles.md`` (causes 1 and 2) and ``tools/analysis/depthwise_conv_check.py``.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ...ops import depthwise_conv3x3_gelu, depthwise_conv_weight_grad
from ...ops.depthwise_conv import compiled_conv3x3_gelu_applies, compiled_weight_grad_applies
from ...ops.linear import needs_grad, onednn_applies, onednn_gemm
from .linear import _without_hooks

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


def channels_last_weight(weight):
    """``weight`` with channels-last strides ``(kh·kw, 1, kw, 1)``.

    ``weight.contiguous(memory_format=torch.channels_last)`` is a no-op for a ``(C, 1, k, k)``
    tensor (it already counts as channels-last contiguous) and oneDNN would still see NCHW
    strides; ``.to(memory_format=...)`` writes the strides that select the NHWC kernel.
    """
    return weight.to(memory_format=torch.channels_last)


class _DepthwiseConvFunction(torch.autograd.Function):
    """Stride-1 depthwise conv: oneDNN forward and input gradient, mmeffvit's weight gradient
    (:func:`mmeffvit.ops.depthwise_conv_weight_grad`)."""

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


def depthwise_conv_grads(x, grad_out, weight, padding, need_input, need_weight, need_bias):
    """Gradients ``(input, weight, bias)`` (None where not needed) of the stride-1 depthwise
    ``F.conv2d(x, weight, bias, padding=padding, groups=C)``: oneDNN's input gradient,
    :func:`mmeffvit.ops.depthwise_conv_weight_grad`, the bias sum. Every gradient is computed
    before this returns (callers may then overwrite ``x``)."""
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


class DepthwiseConv2d(nn.Conv2d):
    """Stride-1 depthwise ``nn.Conv2d`` (``groups = channels``) for maps that are token views.

    A subclass of ``nn.Conv2d``: the parameters keep the names ``weight`` and ``bias`` and the
    ``(C, 1, kh, kw)`` shape, so checkpoints, initialisers and ``isinstance`` checks are
    unchanged. Only the computation differs (same arithmetic, float tolerance):

    * the weight is handed to the conv with channels-last strides, so a channels-last input (the
      ``(B, C, H, W)`` view of ``(B, H*W, C)`` tokens) is convolved without copies and the output
      is channels-last, whose token view is contiguous;
    * on a CPU, in fp32/fp64 outside autocast, kernels of at least
      :data:`CUSTOM_WEIGHT_GRAD_MIN_KERNEL` get their weight gradient from
      :func:`mmeffvit.ops.depthwise_conv_weight_grad` (compiled; without the compiled operators
      as one grouped conv, from :data:`GROUPED_WEIGHT_GRAD_MIN_CHANNELS` channels), faster than
      oneDNN's there.

    Args:
        channels (int): Channels C (in and out).
        kernel_size (int | tuple[int, int]): Kernel ``k`` or ``(kh, kw)``.
        padding (int | tuple[int, int], optional): Default ``k // 2`` (size-preserving for odd k).
        bias (bool): Learnable bias.

    Call with a map ``(B, r·C, H, W)`` or with tokens ``(B, H*W, r·C)`` and ``hw_shape``;
    ``repeats = r`` applies the C-channel kernel set to each of ``r`` consecutive channel groups
    (FLatten's DWC, one kernel set shared by all heads). The output has the input's layout.

    Example:
        >>> conv = DepthwiseConv2d(8, 5)
        >>> conv(torch.randn(2, 6 * 7, 8), (6, 7)).shape
        torch.Size([2, 42, 8])
        >>> conv(torch.randn(2, 16, 6, 7), repeats=2).shape
        torch.Size([2, 16, 6, 7])
    """

    def __init__(self, channels, kernel_size, padding=None, bias=True):
        kernel_size = nn.modules.utils._pair(kernel_size)
        if padding is None:
            padding = (kernel_size[0] // 2, kernel_size[1] // 2)
        super().__init__(channels, channels, kernel_size, padding=padding, groups=channels,
                         bias=bias)

    def _use_custom_weight_grad(self, x, weight):
        return (x.device.type == 'cpu' and max(self.kernel_size) >= CUSTOM_WEIGHT_GRAD_MIN_KERNEL
                and (x.shape[1] >= GROUPED_WEIGHT_GRAD_MIN_CHANNELS
                     or compiled_weight_grad_applies(x))
                and torch.is_grad_enabled() and weight.requires_grad
                and not torch.is_autocast_enabled('cpu')
                and x.dtype in (torch.float32, torch.float64) and x.dtype == weight.dtype)

    def repeated_parameters(self, repeats=1):
        """Weight (channels-last strides) and bias for ``repeats`` consecutive channel groups."""
        weight, bias = self.weight, self.bias
        if repeats > 1:
            weight = weight.repeat(repeats, 1, 1, 1)
            bias = None if bias is None else bias.repeat(repeats)
        return channels_last_weight(weight), bias

    def forward(self, x, hw_shape=None, repeats=1):
        """Args: x ``(B, r·C, H, W)``, or ``(B, H*W, r·C)`` with ``hw_shape = (H, W)``."""
        tokens = hw_shape is not None
        if tokens:
            x = self._token_map(x, hw_shape)
        weight, bias = self.repeated_parameters(repeats)
        if x.shape[1] != weight.shape[0]:
            raise ValueError(f'input has {x.shape[1]} channels, the conv expects '
                             f'{weight.shape[0]} ({self.in_channels} × repeats {repeats})')
        if self._use_custom_weight_grad(x, weight):
            out = _DepthwiseConvFunction.apply(x, weight, bias, self.padding)
        else:
            out = F.conv2d(x, weight, bias, padding=self.padding, groups=weight.shape[0])
        return out.flatten(2).transpose(1, 2) if tokens else out

    @staticmethod
    def _token_map(x, hw_shape):
        b, n, c = x.shape
        if n != hw_shape[0] * hw_shape[1]:
            raise ValueError(f'{n} tokens do not form the grid {tuple(hw_shape)}')
        return x.transpose(1, 2).reshape(b, c, *hw_shape)

    def gelu_applies(self, x):
        """Whether :meth:`forward_gelu` may fuse the conv and GELU: CPU fp32
        inference (nothing needs a gradient, no hooks) where mmeffvit's linears run oneDNN
        (AVX-512 CPUs), where the fused pass was measured faster than the conv and GELU apart;
        on AVX2 it was the slower one (``docs/ops.md``)."""
        return (onednn_gemm() and _ONEDNN_CONV_POINTWISE
                and onednn_applies(x, self.weight) and x.dim() in (3, 4)
                and not needs_grad(x, self.weight, self.bias) and _without_hooks(self))

    def forward_gelu(self, x, hw_shape=None):
        """``F.gelu(self(x, hw_shape))`` (exact GELU), fused where :meth:`gelu_applies`: a 3×3
        kernel on large token maps by mmeffvit's compiled pass
        (:func:`mmeffvit.ops.depthwise_conv3x3_gelu`), otherwise into oneDNN's conv."""
        if not self.gelu_applies(x):
            return F.gelu(self(x, hw_shape))
        tokens = hw_shape is not None
        if (tokens and self.kernel_size == (3, 3) and self.padding == (1, 1)
                and compiled_conv3x3_gelu_applies(x)):
            return depthwise_conv3x3_gelu(x, self.weight, self.bias, hw_shape)
        if tokens:
            x = self._token_map(x, hw_shape)
        weight, bias = self.repeated_parameters()
        out = torch.ops.mkldnn._convolution_pointwise(
            x, weight, bias, list(self.padding), [1, 1], [1, 1], weight.shape[0], 'gelu', [],
            'none')
        return out.flatten(2).transpose(1, 2) if tokens else out
