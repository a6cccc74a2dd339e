"""Softmax attention inside small windows, CPU inference operators: Swin's window attention
(:func:`window_attention`) and Focal attention's, whose keys are gathered from a shared bank
(:func:`gathered_window_attention`)."""
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


def gathered_window_attention_ref(q, bank, index, bias=None, key_mask=None, scale=None):
    """Reference of :func:`gathered_window_attention`: the keys and values gathered from the
    bank, the additive mask ``bias + key_mask`` built, then :func:`window_attention_ref`.

    Args:
        q (Tensor): ``(B·nW, h, nq, d)`` per-head queries of every window (image-major).
        bank (Tensor): ``(B, M, 2, h·d)`` key (``[:, :, 0]``) and value (``[:, :, 1]``) rows.
        index (LongTensor): ``(nW, nk)`` bank row of each window's key slots.
        bias (Tensor, optional): ``(h | 1, nq, nk)`` additive bias, the same for every window.
        key_mask (Tensor, optional): ``(nW | 1, nk)`` additive logit per window and key slot.
        scale (float, optional): Score scale; default ``d ** -0.5``.

    Returns:
        Tensor: ``(B·nW, nq, h·d)``.
    """
    bw, h, nq, d = q.shape
    nw, nk = index.shape
    kv = bank[:, index]  # (B, nW, nk, 2, h·d)
    kv = kv.view(-1, nw, nk, 2, h, d).permute(3, 0, 1, 4, 2, 5).reshape(2, bw, h, nk, d)
    mask = None if bias is None else bias[None]
    if key_mask is not None:
        per_window = key_mask[:, None, None]
        mask = per_window if mask is None else mask + per_window
        if mask.shape[0] == nw:  # one mask per window of every image
            mask = mask.expand(bw // nw, nw, -1, nq, nk).reshape(bw, -1, nq, nk)
    return window_attention_ref(q, kv[0], kv[1], mask, scale)


def _compiled_applies(function, *tensors):
    """Whether the compiled CPU operator ``function`` runs on ``tensors`` (None ones skipped):
    CPU float32 tensors (index tensors aside), nothing needs a gradient, no autocast,
    tracing, compiling or dispatch mode (the MAC counters see ``scaled_dot_product_attention``),
    and a built ``mmeffvit._ext`` that has it."""
    tensors = [t for t in tensors if t is not None]
    if not (all(t.device.type == 'cpu' and t.dtype in (torch.float32, torch.int64)
                for t in tensors)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
            and not torch.is_autocast_enabled('cpu') and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None
            and not torch._C._are_functorch_transforms_active()):
        return False
    ext = get_ext(tensors[0])
    return ext is not None and hasattr(ext, function)


def window_attention_applies(q, k, v, mask=None):
    """Whether :func:`window_attention` runs the compiled CPU operator (see
    :func:`_compiled_applies`)."""
    if any(t.dtype != torch.float32 for t in (q, k, v)):
        return False
    return _compiled_applies('window_attention_forward', q, k, v, mask)


def gathered_window_attention_applies(q, bank, index, bias=None, key_mask=None):
    """Whether :func:`gathered_window_attention` runs the compiled CPU operator."""
    if any(t is not None and t.dtype != torch.float32 for t in (q, bank, bias, key_mask)):
        return False
    return _compiled_applies('gathered_window_attention_forward', q, bank, index, bias,
                             key_mask)


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


def gathered_window_attention(q, bank, index, bias=None, key_mask=None, scale=None):
    """Softmax attention of windows whose keys and values are rows of a shared bank (Focal
    attention's window, ring and pooled keys), ``softmax(q·kᵀ·scale + bias + key_mask)·v``,
    heads merged into ``(B·nW, nq, h·d)``; arguments as :func:`gathered_window_attention_ref`.

    In CPU inference (:func:`gathered_window_attention_applies`) the compiled operator reads each
    window's keys through ``index`` and adds ``bias`` and ``key_mask`` to its scores, so
    neither the gathered keys ``(B·nW, h, nk, d)`` ×2 nor the summed mask ``(B·nW, h, nq,
    nk)`` is written (at stage 1 of Focal-T at 800×1333, 1392 windows, ~250 and ~190 MB per
    block); elsewhere the reference.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if not gathered_window_attention_applies(q, bank, index, bias, key_mask):
        return gathered_window_attention_ref(q, bank, index, bias, key_mask, scale)
    return get_ext(q).gathered_window_attention_forward(q, bank, index, bias, key_mask,
                                                        float(scale))
