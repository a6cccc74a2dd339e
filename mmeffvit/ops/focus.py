"""The focusing function of FLatten (sec. 4.1, eq. 5-6) as one fused operator."""
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..utils import at_least_fp32
from .ext_loader import get_ext


def focus_feature_map_ref(x, scale, focusing_factor=3, eps=1e-6):
    """Pure-PyTorch reference of :func:`focus_feature_map` (the composite chain)."""
    x = (F.relu(at_least_fp32(x)) + eps) / F.softplus(at_least_fp32(scale))
    x_norm = x.norm(dim=-1, keepdim=True)
    x_pow = x.pow(focusing_factor)
    return x_pow * (x_norm / x_pow.norm(dim=-1, keepdim=True))


class FocusFeatureMap(torch.autograd.Function):
    """Autograd wrapper of ``_ext.focus_forward/backward``; saves only ``x`` and ``scale``.

    The backward recomputes ``relu(x) + eps``, the power and both norms per row instead of
    keeping them, which is what keeps the training-time memory at the size of the input.
    """

    @staticmethod
    def forward(ctx, x, scale, focusing_factor, eps):
        ext = get_ext(x)
        c = x.shape[-1]
        x2 = x.reshape(-1, c)
        with torch.autocast(x.device.type, enabled=False):  # the ATen calls inside stay fp32
            y = ext.focus_forward(x2, scale.reshape(-1), float(focusing_factor), float(eps))
        ctx.save_for_backward(x2, scale)
        ctx.params = (ext, float(focusing_factor), float(eps), x.shape)
        return y.reshape(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x2, scale = ctx.saved_tensors
        ext, p, eps, shape = ctx.params
        with torch.autocast(x2.device.type, enabled=False):
            gx, gscale = ext.focus_backward(grad.reshape(x2.shape), x2, scale.reshape(-1), p, eps)
        return gx.reshape(shape), gscale.reshape(scale.shape), None, None


def focus_feature_map(x, scale, focusing_factor=3, eps=1e-6):
    """Focused kernel φ_p of FLatten (sec. 4.1, eq. 5-6), fp32 accumulation for any dtype.

    ``relu(x) + eps`` keeps every entry positive, a learnable per-channel ``softplus(scale)``
    divides it, then ``f_p(t) = ||t|| * t**p / ||t**p||`` sharpens the direction while keeping the
    norm. The norms run over **all** channels of a token (heads together), as the official code.
    Runs the fused compiled operator when it is available (see :mod:`mmeffvit.ops.ext_loader`),
    else :func:`focus_feature_map_ref`.

    Args:
        x (Tensor): ``(..., C)`` queries or keys, any float dtype.
        scale (Tensor): ``C`` raw scale values, any shape with C elements (``(1, 1, C)`` in the
            models); softplus is applied here.
        focusing_factor (float): The power p.
        eps (float): Added after the ReLU.

    Returns:
        Tensor: fp32 (fp64 for fp64 input) tensor of the shape of ``x``.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f'focus_feature_map expects a floating-point tensor, got '
                        f'{getattr(x, "dtype", type(x))}')
    if scale.numel() != x.shape[-1]:
        raise ValueError(f'scale has {scale.numel()} elements, x has {x.shape[-1]} channels')
    if x.device != scale.device:
        raise ValueError(f'x and scale are on different devices ({x.device}, {scale.device})')
    if get_ext(x) is None or x.numel() == 0:
        return focus_feature_map_ref(x, scale, focusing_factor, eps)
    return FocusFeatureMap.apply(x, scale, focusing_factor, eps)
