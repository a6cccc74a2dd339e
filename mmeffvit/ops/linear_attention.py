"""Kv-first linear attention on already-mapped features, as one operator (no N×n tensor)."""
import torch
from torch.autograd.function import once_differentiable

from ..utils import at_least_fp32
from .ext_loader import get_ext
from .triton_kernels import selected as triton_selected

_MODES = {'mean': 0, 'sum': 1}


def linear_attention_ref(q, k, v=None, normalizer='mean', eps=1e-6, temperature=None,
                         clamp_min=100.):
    """Pure-PyTorch reference of :func:`linear_attention` (same arguments)."""
    v = k if v is None else v
    n = k.shape[-2]
    tau = None if temperature is None else _heads_param(temperature, q)
    if normalizer == 'mean':
        # FLatten's May 2024 form: K^T V / n and q.mean(k) keep every intermediate O(1)
        z = 1.0 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + eps)
        kv = (k.transpose(-2, -1) * n ** -0.5) @ (v * n ** -0.5)
    else:
        z = 1.0 / torch.clamp(q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1), min=clamp_min)
        kv = k.transpose(-2, -1) @ v
    if tau is not None:
        kv = kv * tau
    return (q @ kv) * z


def _heads_param(temperature, q):
    if not isinstance(temperature, torch.Tensor):
        return torch.full((1, q.shape[1], 1, 1), float(temperature), dtype=q.dtype,
                          device=q.device)
    if temperature.numel() not in (1, q.shape[1]):
        raise ValueError(f'temperature must have 1 or h={q.shape[1]} elements, got shape '
                         f'{tuple(temperature.shape)}')
    return temperature.reshape(1, -1, 1, 1).expand(1, q.shape[1], 1, 1)


class LinearAttentionFunction(torch.autograd.Function):
    """Autograd wrapper of ``_ext.linear_attention_forward/backward``.

    Saves the inputs plus the (d × e) state and the key sum; the backward recomputes the
    normaliser per row, so nothing of size N beyond the inputs is kept.
    """

    @staticmethod
    def forward(ctx, q, k, v, temperature, mode, eps, clamp_min):
        ext = get_ext(q)
        with torch.autocast(q.device.type, enabled=False):  # the ATen GEMMs inside stay fp32
            out, kv, ksum = ext.linear_attention_forward(q, k, v, temperature, mode, eps,
                                                         clamp_min)
        ctx.save_for_backward(q, k, v, kv, ksum, temperature)
        ctx.params = (ext, mode, eps, clamp_min)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, kv, ksum, temperature = ctx.saved_tensors
        ext, mode, eps, clamp_min = ctx.params
        with torch.autocast(q.device.type, enabled=False):
            dq, dk, dv, dt = ext.linear_attention_backward(grad, q, k, v, kv, ksum, temperature,
                                                           mode, eps, clamp_min)
        if temperature is not None and dt is not None:
            dt = dt.reshape(temperature.shape)
        return dq, dk, dv, dt, None, None, None


def linear_attention(q, k, v=None, normalizer='mean', eps=1e-6, temperature=None,
                     clamp_min=100.):
    """``o_i = τ φ(q_i)·(Σ_j φ(k_j)^T v_j) / normaliser_i`` on mapped features, kv-first.

    Normalisers (``normalizer``):

    * ``'mean'`` (FLatten, sec. 4, official May 2024 form): state ``Σ_j k_j^T v_j / n`` and
      normaliser ``q_i · mean_j k_j + eps``;
    * ``'sum'`` (L²ViT, sec. 3.2): state ``Σ_j k_j^T v_j`` and normaliser
      ``max(q_i · Σ_j k_j, clamp_min)``, rows with little attention mass are divided by
      ``clamp_min`` instead of being normalised.

    ``temperature`` (a float or a tensor with one value per head, e.g. L²ViT's learnable
    ``(h, 1, 1)``) multiplies the state; ``v=None`` uses the (mapped) keys as values, ``v = k``,
    with the gradients of both uses summed; CARE's identity values (the un-projected input
    tokens, no value projection) are an ordinary ``v``.
    The compiled operator never forms an N×n or full-size intermediate and accumulates in fp32;
    the result has the dtype of ``q``. With the Triton kernels selected
    (``use_kernels(triton=True)``, a tensor or no temperature): the op
    ``mmeffvit::linear_attention``, two passes forward, two backward.

    Args:
        q (Tensor): ``(B, h, N, d)`` mapped queries.
        k (Tensor): ``(B, h, n, d)`` mapped keys.
        v (Tensor, optional): ``(B, h, n, e)`` values.
        normalizer (str): ``'mean'`` or ``'sum'``.
        eps (float): Added to the normaliser in the ``'mean'`` mode.
        temperature (float | Tensor, optional): Per-head factor τ of the state.
        clamp_min (float): Lower clamp of the normaliser in the ``'sum'`` mode.

    Returns:
        Tensor: ``(B, h, N, e)``.
    """
    if normalizer not in _MODES:
        raise ValueError(f"normalizer must be 'mean' or 'sum', got {normalizer!r}")
    for name, t in (('q', q), ('k', k), ('v', v)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 4):
            raise ValueError(f'{name} must be a 4-D tensor (B, h, tokens, dims), got '
                             f'{getattr(t, "shape", type(t))}')
    identity = v is None
    vv = k if identity else v
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1] or vv.shape[:3] != k.shape[:3]:
        raise ValueError(f'shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, '
                         f'v {tuple(vv.shape)} (expected (B, h, N, d), (B, h, n, d), (B, h, n, e))')
    if not (q.dtype == k.dtype == vv.dtype) or not q.is_floating_point():
        raise TypeError(f'q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, '
                        f'{vv.dtype}')
    if not (q.device == k.device == vv.device):
        raise ValueError(f'q, k, v are on different devices: {q.device}, {k.device}, {vv.device}')
    if (q.numel() and k.shape[-2] and triton_selected(q, k, vv)
            and (temperature is None or isinstance(temperature, torch.Tensor))):
        temp = None if temperature is None else _heads_param(temperature, q).reshape(-1)
        out, _ = torch.ops.mmeffvit.linear_attention(q, k, vv, temp, _MODES[normalizer],
                                                     float(eps), float(clamp_min))
        return out
    if get_ext(q) is None or q.numel() == 0 or k.shape[-2] == 0:
        return linear_attention_ref(q, k, v, normalizer, eps, temperature, clamp_min)
    temp = temperature
    if temperature is not None:
        temp = _heads_param(temperature, q).reshape(-1).contiguous()
        if isinstance(temperature, torch.Tensor):
            temp = temp.to(at_least_fp32(temperature).dtype)
    return LinearAttentionFunction.apply(q, k, vv, temp, _MODES[normalizer], float(eps),
                                         float(clamp_min))
