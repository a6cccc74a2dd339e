"""Depthwise convolution on token maps, in the channels-last layout the tokens already have.

Every family here runs depthwise convs on maps that are views of ``(B, H*W, C)`` tokens:
:class:`DepthwiseConv2d` is ``nn.Conv2d`` for them, whose forward calls
:func:`mmeffvit.ops.depthwise_conv` (the kernel choice, channels-last weights and the weight
gradient live there).
"""
import torch.nn as nn

from ... import ops
from ...ops.depthwise_conv import channels_last_weight


class DepthwiseConv2d(nn.Conv2d):
    """Stride-1 depthwise ``nn.Conv2d`` (``groups = channels``) for maps that are token views.

    A subclass of ``nn.Conv2d``: the parameters keep the names ``weight`` and ``bias`` and the
    ``(C, 1, kh, kw)`` shape, so checkpoints, initialisers and ``isinstance`` checks are
    unchanged. The forward is :func:`mmeffvit.ops.depthwise_conv` (same arithmetic to float
    tolerance): weights with channels-last strides, so a channels-last input (the
    ``(B, C, H, W)`` view of ``(B, H*W, C)`` tokens) is convolved without copies and the output's
    token view is contiguous, and mmeffvit's weight gradient for large kernels on a CPU.

    Args:
        channels (int): Channels C (in and out).
        kernel_size (int | tuple[int, int]): Kernel ``k`` or ``(kh, kw)``.
        padding (int | tuple[int, int], optional): Default ``k // 2`` (size-preserving for odd k).
        bias (bool): Learnable bias.

    Call with a map ``(B, r·C, H, W)`` or with tokens ``(B, H*W, r·C)`` and ``hw_shape``;
    ``repeats = r`` applies the C-channel kernel set to each of ``r`` consecutive channel groups
    (FLatten's DWC, one kernel set shared by all heads). The output has the input's layout.

    Example:
        >>> import torch
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

    def repeated_parameters(self, repeats=1):
        """Weight (channels-last strides) and bias for ``repeats`` consecutive channel groups."""
        weight, bias = self.weight, self.bias
        if repeats > 1:
            weight = weight.repeat(repeats, 1, 1, 1)
            bias = None if bias is None else bias.repeat(repeats)
        return channels_last_weight(weight), bias

    def forward(self, x, hw_shape=None, repeats=1):
        """Args: x ``(B, r·C, H, W)``, or ``(B, H*W, r·C)`` with ``hw_shape = (H, W)``."""
        weight, bias = self.repeated_parameters(repeats)
        channels = x.shape[-1] if hw_shape is not None else x.shape[1]
        if x.dim() in (3, 4) and channels != weight.shape[0]:
            raise ValueError(f'input has {channels} channels, the conv expects '
                             f'{weight.shape[0]} ({self.in_channels} × repeats {repeats})')
        return ops.depthwise_conv(x, weight, bias, hw_shape, self.padding)
