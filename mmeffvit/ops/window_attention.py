"""Softmax attention inside small windows (Swin's window attention), CPU inference operator."""
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .ext_loader import get_ext


def window_attention_ref(q, k, v, mask=None, scale=None):
    """``softmax(q·kᵀ·scale + mask)·v`` with the heads merged: the reference of
    :func:`window_attention` (``F.scaled_dot_product_attention``, then the head merge).

    Args:
        q, k, v (Tensor): ``(BW, h, n, d)`` windows' per-head queries, keys and values.
        mask (Tensor, optional): Additive ``(BW | 1, h | 1, n, n)`` mask (bias and shift mask).
        scale (float, optional): Score scale; default ``d ** -0.5``.

    Returns:
        Tensor: ``(BW, n, h·d)``.
    """
    bw, h, n, d = q.shape
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).reshape(bw, n, h * d)


def window_attention_applies(q, k, v, mask=None):
    """Whether :func:`window_attention` runs the compiled CPU operator: CPU float32 tensors,
    nothing needs a gradient, no autocast, tracing, compiling or dispatch mode (the MAC
    counters see ``scaled_dot_product_attention``), and a built ``mmeffvit._ext`` that has it."""
    tensors = (q, k, v) if mask is None else (q, k, v, mask)
    if not (all(t.device.type == 'cpu' and t.dtype == torch.float32 for t in tensors)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
            and not torch.is_autocast_enabled('cpu') and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None
            and not torch._C._are_functorch_transforms_active()):
        return False
    ext = get_ext(q)
    return ext is not None and hasattr(ext, 'window_attention_forward')


def window_attention(q, k, v, mask=None, scale=None):
    """``softmax(q·kᵀ·scale + mask)·v`` per window and head, heads merged into ``(BW, n, h·d)``.

    In CPU inference (:func:`window_attention_applies`) one compiled pass per (window, head)
    with the keys in L1 and the output written merged; elsewhere
    :func:`window_attention_ref`. Same arguments and result (float tolerance: the scores'
    summation order and the exponential's polynomial differ from torch's kernels).
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if not window_attention_applies(q, k, v, mask):
        return window_attention_ref(q, k, v, mask, scale)
    return get_ext(q).window_attention_forward(q, k, v, mask, float(scale))
