"""Weight gradient of a stride-1 depthwise convolution on channels-last (token) maps."""
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
