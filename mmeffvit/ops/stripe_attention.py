"""CSWin's cross-shaped window attention, one branch: softmax attention inside stripes plus the
locally-enhanced positional encoding (CSWin, sec. 3.2-3.3, Eq. 3-4), the kernel chosen inside.

A branch attends within windows of ``(wh, ww)`` tokens tiling the map: vertical stripes
``(H, sw)``, horizontal ones ``(sw, W)``, or the whole map ``(H, W)``. LePE is a depthwise 3×3
conv on v inside each window (its zero padding at the window's edges) added to the output.
A map that the windows do not tile is zero-padded at its bottom / right: padded keys are
ignored, padded v is zero, so each real token's output is what a shorter last stripe gives.

Paths: the Triton op ``mmeffvit::stripe_attention`` where the policy selects Triton and no
attention dropout is asked for (q, k, v read in place by index arithmetic, LePE fused: one
launch forward, three backward), else the composed path: stripes cut by reshapes,
:func:`~mmeffvit.ops.attention` on their real tokens, the conv, the crop.
"""
import numpy as np
import torch
import torch.nn.functional as F

from ..utils.geometry_cache import GeometryCache
from .attention import attention
from .triton_kernels import selected as triton_selected

_valid_cache = GeometryCache(maxsize=16)


def window_grid(hw, window):
    """``(gh, gw, pad_h, pad_w)``: windows along each side and the padding that tiles the map."""
    (h, w), (wh, ww) = hw, window
    pad_h, pad_w = (-h) % wh, (-w) % ww
    return (h + pad_h) // wh, (w + pad_w) // ww, pad_h, pad_w


def valid_tokens(hw, window, device):
    """``(nW, wh·ww)`` bool, True at the real tokens of each window of an image (windows
    row-major; None when the windows tile the map), cached per geometry. Every window starts
    inside the map, so each keeps at least one real token."""
    (h, w), (wh, ww) = hw, window
    gh, gw, pad_h, pad_w = window_grid(hw, window)
    if not (pad_h or pad_w):
        return None

    def build():  # on the host: a table of the geometry alone
        real = (np.arange(h + pad_h) < h)[:, None] & (np.arange(w + pad_w) < w)[None, :]
        real = real.reshape(gh, wh, gw, ww).transpose(0, 2, 1, 3).reshape(-1, wh * ww)
        return torch.from_numpy(np.ascontiguousarray(real)).to(device)
    return _valid_cache((h, w, wh, ww, device), build)


def _check(q, k, v, hw, window, heads, weight, bias):
    b, n, c = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f'stripe_attention: q, k, v must share one (B, H*W, C) shape, got '
                         f'{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}')
    if hw[0] * hw[1] != n:
        raise ValueError(f'stripe_attention: a {hw[0]}x{hw[1]} map has {hw[0] * hw[1]} tokens, '
                         f'got {n}')
    if any(s < 1 for s in window):
        raise ValueError(f'stripe_attention: window sides must be positive, got {window}')
    if c % heads:
        raise ValueError(f'stripe_attention: {c} channels do not split into {heads} heads')
    if tuple(weight.shape) != (c, 1, 3, 3) or (bias is not None and tuple(bias.shape) != (c, )):
        raise ValueError(f'stripe_attention: LePE needs a ({c}, 1, 3, 3) weight and a ({c},) '
                         f'bias, got {tuple(weight.shape)} and '
                         f'{None if bias is None else tuple(bias.shape)}')


def _composed(q, k, v, hw, window, heads, weight, bias, scale, dropout):
    """Stripes cut straight from the ``(B, H, W, C)`` view of each tensor, heads split in the
    same reshape (one copy, none for unpadded horizontal / whole-map stripes), attended on their
    real tokens; the result is put back in token order and cropped (one copy)."""
    b, _, c = q.shape
    (h, w), (wh, ww) = hw, window
    gh, gw, pad_h, pad_w = window_grid(hw, window)
    hp, wp = h + pad_h, w + pad_w
    d, n = c // heads, wh * ww

    def stripes(t):  # (B, H*W, C) -> (B·nW, wh, ww, C), windows row-major
        t = t.reshape(b, h, w, c)
        if pad_h or pad_w:
            t = F.pad(t, (0, 0, 0, pad_w, 0, pad_h))
        t = t.reshape(b, gh, wh, gw, ww, c).transpose(2, 3)
        return t.reshape(b * gh * gw, wh, ww, c)

    def split_heads(t):  # (B', wh, ww, C) -> (B', heads, n, d), channel = head * d + j
        return t.reshape(-1, n, heads, d).transpose(1, 2)

    qw, kw, vw = stripes(q), stripes(k), stripes(v)
    # channels-last view: zeros beyond the map act as the conv's own padding at an edge
    lepe = F.conv2d(vw.permute(0, 3, 1, 2), weight, bias, padding=1, groups=c)
    att = attention(split_heads(qw), split_heads(kw), split_heads(vw), scale=scale,
                    valid=valid_tokens(hw, window, q.device), dropout=dropout)
    res = att.transpose(1, 2).reshape(-1, wh, ww, c) + lepe.permute(0, 2, 3, 1).to(att.dtype)
    # (B·nW, wh, ww, C) -> (B, gh, wh, gw, ww, C) -> crop
    res = res.reshape(b, gh, gw, wh, ww, c).transpose(2, 3).reshape(b, hp, wp, c)[:, :h, :w]
    return res.reshape(b, h * w, c)


def stripe_attention(q, k, v, hw, window, heads, weight, bias=None, *, scale=None, dropout=0.):
    """One branch of CSWin's cross-shaped window attention with LePE (CSWin, sec. 3.2, Eq. 3,
    and sec. 3.3, Eq. 4): ``softmax(q kᵀ · scale) v + DWConv3×3(v)`` inside each window.

    Args:
        q, k, v (Tensor): ``(B, H*W, C)`` in token order (views into a fused projection are
            fine), channel ``head · d + j``.
        hw (tuple[int, int]): The map ``(H, W)``.
        window (tuple[int, int]): Window ``(wh, ww)``; need not divide the map.
        heads (int): Heads of the branch.
        weight (Tensor): LePE's depthwise conv weight ``(C, 1, 3, 3)``.
        bias (Tensor, optional): Its bias ``(C,)``.
        scale (float, optional): Score scale, default ``d ** -0.5``.
        dropout (float): On the attention weights (0 in inference).

    Returns:
        Tensor: ``(B, H*W, C)``.
    """
    hw, window = tuple(hw), tuple(window)
    _check(q, k, v, hw, window, heads, weight, bias)
    if scale is None:
        scale = (q.shape[-1] // heads) ** -0.5
    lepe = [weight] if bias is None else [weight, bias]
    if not dropout and triton_selected(q, k, v, *lepe):
        return torch.ops.mmeffvit.stripe_attention(q, k, v, weight, bias, *hw, *window, heads,
                                                   float(scale))[0]
    return _composed(q, k, v, hw, window, heads, weight, bias, scale, dropout)
