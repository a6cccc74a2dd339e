"""FLatten's focusing function and kv-first linear attention fused into one operator."""
import torch
from torch.autograd.function import once_differentiable

from ..utils import at_least_fp32
from .ext_loader import get_ext
from .focus import focus_feature_map, focus_feature_map_ref
from .linear_attention import linear_attention, linear_attention_ref
from .triton_kernels import selected as triton_selected

FOCUS_EPS = 1e-6  # added after the ReLU of the focusing function
EPS = 1e-6  # added to the normaliser


def _composed(q, k, v, scale, num_heads, focusing_factor, focus_eps, eps, focus_fn, attn_fn):
    b, n, _ = q.shape

    def heads(t):
        return t.reshape(b, t.shape[1], num_heads, -1).transpose(1, 2)

    qf = focus_fn(q, scale, focusing_factor, focus_eps)
    kf = focus_fn(k, scale, focusing_factor, focus_eps)
    out = attn_fn(heads(qf), heads(kf), heads(at_least_fp32(v)), normalizer='mean', eps=eps)
    return out.transpose(1, 2).reshape(b, n, -1).to(q.dtype)


def focused_linear_attention_ref(q, k, v, scale, num_heads, focusing_factor=3,
                                 focus_eps=FOCUS_EPS, eps=EPS):
    """Pure-PyTorch reference of :func:`focused_linear_attention` (same arguments)."""
    return _composed(q, k, v, scale, num_heads, focusing_factor, focus_eps, eps,
                     focus_feature_map_ref, linear_attention_ref)


class FocusedLinearAttentionFunction(torch.autograd.Function):
    """Autograd wrapper of ``_ext.focused_linear_attention_forward/backward`` (CPU).

    Saves the raw q, k, v, the scale and the small (d × e) state and key mean; the backward
    recomputes the focused features block by block, so no mapped copy of q or k is ever stored.

    Takes q, k, v as head views ``(B, tokens, h, d)`` (free reshapes of the token layout) so
    that a trace shows the head split, which the MAC counter needs; the kernel sees the token
    layout ``(B, tokens, h*d)``.
    """

    @staticmethod
    def forward(ctx, q, k, v, scale, focusing_factor, focus_eps, eps):
        ext = get_ext(q)
        heads = q.shape[2]
        with torch.autocast(q.device.type, enabled=False):
            out, kv, ksum = ext.focused_linear_attention_forward(
                q.flatten(2), k.flatten(2), v.flatten(2), scale, heads, focusing_factor,
                focus_eps, eps)
        ctx.save_for_backward(q, k, v, scale, kv, ksum)
        ctx.params = (ext, focusing_factor, focus_eps, eps)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, scale, kv, ksum = ctx.saved_tensors
        ext, p, focus_eps, eps = ctx.params
        with torch.autocast(q.device.type, enabled=False):
            dq, dk, dv, dscale = ext.focused_linear_attention_backward(
                grad.to(q.dtype), q.flatten(2), k.flatten(2), v.flatten(2), scale, kv, ksum,
                q.shape[2], p, focus_eps, eps)
        return (dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), dscale.reshape(scale.shape),
                None, None, None)


def focused_linear_attention(q, k, v, scale, num_heads, focusing_factor=3, focus_eps=FOCUS_EPS,
                             eps=EPS, residual=None):
    """Focused linear attention of FLatten (sec. 4.1, eq. 5-7) on projected tokens, one operator.

    ``φ_p`` (:func:`focus_feature_map`) maps q and k over all C channels, the heads are split and
    ``o_i = φ(q_i)·(Σ_j φ(k_j)^T v_j / n) / (φ(q_i)·mean_j φ(k_j) + eps)`` is computed per head
    (:func:`linear_attention`, ``normalizer='mean'``); heads are merged back. On CPU the compiled
    kernel does all of it in one pass over blocks of tokens: the mapped features exist only in a
    cache-sized buffer, so the forward allocates nothing but its output and the backward nothing
    but the gradients. With the Triton kernels selected (``use_kernels(triton=True)``) two
    Triton passes per head (key state, then queries; the residual added in the second) and a
    backward that recomputes the features; else on CUDA the two CUDA operators are composed;
    without the extension the reference runs. Accumulation is fp32 (fp64 for fp64 inputs) for
    any input dtype.

    Args:
        q (Tensor): ``(B, N, C)`` projected queries.
        k (Tensor): ``(B, n, C)`` projected keys (positional encoding already added).
        v (Tensor): ``(B, n, Ce)`` projected values.
        scale (Tensor): ``C`` raw scale values (softplus is applied here).
        num_heads (int): Heads h, dividing C and Ce.
        focusing_factor (float): The power p.
        focus_eps (float): Added after the ReLU of the focusing function.
        eps (float): Added to the normaliser.
        residual (Tensor, optional): ``(B, N, Ce)`` added to the output (FLatten's
            depthwise-conv term), any strides.

    Returns:
        Tensor: ``(B, N, Ce)`` in the dtype of ``q``.
    """
    for name, t in (('q', q), ('k', k), ('v', v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or not t.is_floating_point():
            raise ValueError(f'{name} must be a floating (B, tokens, channels) tensor, got '
                             f'{getattr(t, "shape", type(t))}')
    b, _, c = q.shape
    if k.shape[0] != b or k.shape[2] != c or v.shape[:2] != k.shape[:2]:
        raise ValueError(f'shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, '
                         f'v {tuple(v.shape)} (expected (B, N, C), (B, n, C), (B, n, Ce))')
    if c % num_heads or v.shape[2] % num_heads:
        raise ValueError(f'channels {c} / {v.shape[2]} are not divisible by {num_heads} heads')
    if scale.numel() != c:
        raise ValueError(f'scale has {scale.numel()} elements, q has {c} channels')
    if not (q.device == k.device == v.device == scale.device):
        raise ValueError(f'q, k, v, scale are on different devices: {q.device}, {k.device}, '
                         f'{v.device}, {scale.device}')
    if residual is not None and (residual.shape != (b, q.shape[1], v.shape[2])
                                 or residual.device != q.device):
        raise ValueError(f'residual must be a (B, N, Ce) = {(b, q.shape[1], v.shape[2])} tensor '
                         f'on {q.device}, got {tuple(residual.shape)} on {residual.device}')
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if q.numel() and k.shape[1] and triton_selected(q, k, v, scale):  # (registers the op)
        out, _ = torch.ops.mmeffvit.focused_linear_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), scale, num_heads, float(focusing_factor),
            float(focus_eps), float(eps), residual)
        return out.to(q.dtype)
    out = _focused_linear_attention(q, k, v, scale, num_heads, focusing_factor, focus_eps, eps,
                                    dtype)
    return out if residual is None else out + residual.to(out.dtype)


def _focused_linear_attention(q, k, v, scale, num_heads, focusing_factor, focus_eps, eps, dtype):
    """The compiled operators' and the references' paths of :func:`focused_linear_attention`."""
    ext = get_ext(q)
    if ext is None or q.numel() == 0 or k.shape[1] == 0:
        return focused_linear_attention_ref(q, k, v, scale, num_heads, focusing_factor,
                                            focus_eps, eps)
    if q.device.type != 'cpu':
        return _composed(q, k, v, scale, num_heads, focusing_factor, focus_eps, eps,
                         focus_feature_map, linear_attention)

    def heads(t):
        return t.to(dtype).unflatten(-1, (num_heads, -1))
    out = FocusedLinearAttentionFunction.apply(heads(q), heads(k), heads(v), scale,
                                               float(focusing_factor), float(focus_eps),
                                               float(eps))
    return out.to(q.dtype)
