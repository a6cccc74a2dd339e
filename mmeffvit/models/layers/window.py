"""Padding and window partition helpers of the windowed-attention backbones.

Non-overlapping ``w×w`` (or ``wh×ww``: every ``window`` argument takes an int or an
``(h, w)`` pair) windows of a channels-last map, row-major over the window grid and
row-major inside each window, as in Swin (Liu et al., ICCV 2021, sec. 3.2) and the Focal
Transformer / L²ViT windows built on it. Maps are zero-padded at the bottom/right, so any
``H×W`` works; callers crop back to ``H×W`` after :func:`window_reverse`.
"""
import numpy as np
import torch
import torch.nn.functional as F

from ...utils.geometry_cache import geometry_cached


def _pair(window):
    return (window, window) if isinstance(window, int) else tuple(window)


def pad_to_multiple(x, multiple):
    """Zero-pad a channels-first ``(B, C, H, W)`` map right/bottom to multiples of ``multiple``
    (e.g. before a stride-``multiple`` patch embedding; ``x`` itself when nothing is needed)."""
    pad_h, pad_w = -x.shape[-2] % multiple, -x.shape[-1] % multiple
    return F.pad(x, (0, pad_w, 0, pad_h)) if pad_h or pad_w else x


def pad_to_windows(x, window):
    """Zero-pad a channels-last ``(B, H, W, C)`` map bottom/right to multiples of ``window``
    (``x`` itself when nothing is needed)."""
    wh, ww = _pair(window)
    pad_b, pad_r = -x.shape[1] % wh, -x.shape[2] % ww
    return F.pad(x, (0, 0, 0, pad_r, 0, pad_b)) if pad_b or pad_r else x


def window_partition(x, window, num_heads=None):
    """Split a padded ``(B, Hp, Wp, C)`` map into its ``nW = (Hp/w)·(Wp/w)`` windows.

    Returns:
        Tensor: ``(B·nW, w², C)``, or with ``num_heads`` h the per-head layout
        ``(B, nW, h, w², C/h)`` (channel ``c`` belongs to head ``c // (C/h)``).
    """
    b, hp, wp, c = x.shape
    wh, ww = _pair(window)
    gh, gw = hp // wh, wp // ww
    if num_heads is None:
        x = x.reshape(b, gh, wh, gw, ww, c).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(b * gh * gw, wh * ww, c)
    d = c // num_heads
    x = x.reshape(b, gh, wh, gw, ww, num_heads, d).permute(0, 1, 3, 5, 2, 4, 6)
    return x.reshape(b, gh * gw, num_heads, wh * ww, d)


def window_reverse(windows, window, hp, wp):
    """Inverse of :func:`window_partition`: windows back to a ``(B, Hp, Wp, C)`` map, in one
    copy. Layouts: ``(B·nW, wh·ww, C)``, per head ``(B, nW, h, wh·ww, d)``, or heads apart
    ``(B·nW, wh·ww, h, d)`` (the attention ops' output, possibly a transposed view)."""
    wh, ww = _pair(window)
    gh, gw = hp // wh, wp // ww
    if windows.dim() == 5:  # (B, nW, h, wh·ww, d)
        b, _, h, _, d = windows.shape
        x = windows.reshape(b, gh, gw, h, wh, ww, d).permute(0, 1, 4, 2, 5, 3, 6)
        return x.reshape(b, hp, wp, h * d)
    if windows.dim() == 4:  # (B·nW, wh·ww, h, d)
        h, d = windows.shape[2:]
        x = windows.reshape(-1, gh, gw, wh, ww, h, d).permute(0, 1, 3, 2, 4, 5, 6)
        return x.reshape(-1, hp, wp, h * d)
    c = windows.shape[-1]
    x = windows.reshape(-1, gh, gw, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, hp, wp, c)


def window_order(hp, wp, window, shift=0, device=None):
    """Map position of every token of the windows of a ``Hp×Wp`` map rolled by ``-shift``.

    ``x.reshape(B, Hp·Wp, C).index_select(1, order)`` is :func:`window_partition` of
    ``torch.roll(x, (-shift, -shift), (1, 2))`` as ``(B, nW·w², C)``, in one copy instead of
    the roll's and the permute's two (Swin's cyclic shift, sec. 3.2). Cached per geometry:
    the returned tensor is shared, never modify it.

    Returns:
        LongTensor: ``(Hp·Wp, )``.
    """
    return _window_order(hp, wp, _pair(window), shift, device)


def _window_order_table(hp, wp, window, shift):
    # index tables in NumPy, moved to the device once per geometry: constants for tracing and
    # compiling, and no device computation whose result the host must wait for
    wh, ww = window
    ys = (np.arange(hp) + shift) % hp
    xs = (np.arange(wp) + shift) % wp
    pos = ys[:, None] * wp + xs[None, :]
    return pos.reshape(hp // wh, wh, wp // ww, ww).transpose(0, 2, 1, 3).reshape(-1)


def _on_device(table, device):
    return torch.from_numpy(np.ascontiguousarray(table, dtype=np.int64)).to(device)


@geometry_cached(maxsize=64)
def _window_order(hp, wp, window, shift, device):
    return _on_device(_window_order_table(hp, wp, _pair(window), shift), device)


def window_order_inverse(height, width, hp, wp, window, shift=0, device=None):
    """Slot in the :func:`window_order` layout of every token of the ``H×W`` map (the padding
    cropped): ``out.reshape(B, nW·w², C).index_select(1, inverse)`` is the ``(B, H·W, C)``
    map of window outputs, window reverse, roll back and crop in one copy. Cached, shared.
    """
    return _window_order_inverse(height, width, hp, wp, _pair(window), shift, device)


@geometry_cached(maxsize=64)
def _window_order_inverse(height, width, hp, wp, window, shift, device):
    order = _window_order_table(hp, wp, _pair(window), shift)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return _on_device(inverse.reshape(hp, wp)[:height, :width].reshape(-1), device)


def window_order_unpadded(height, width, window, shift=0, device=None):
    """:func:`window_order` with slots that index the ``H×W`` map itself, for callers that
    project the tokens before the window partition (the padding's projection is constant: the
    layer's bias). Cached, shared.

    Returns:
        tuple[LongTensor, LongTensor]: ``(Hp·Wp, )`` token of every window slot in the
        ``(B, H·W, C)`` map (0 for padding), and the ``(P, )`` slots that are padding.
    """
    return _window_order_unpadded(height, width, _pair(window), shift, device)


@geometry_cached(maxsize=64)
def _window_order_unpadded(height, width, window, shift, device):
    wh, ww = _pair(window)
    hp, wp = height + -height % wh, width + -width % ww
    order = _window_order_table(hp, wp, (wh, ww), shift)
    rows, cols = order // wp, order % wp
    inside = (rows < height) & (cols < width)
    slots = np.where(inside, rows * width + cols, 0)
    # the padding slots in order, by a stable sort rather than a search: their count is known
    # from the sizes, so a trace of this builder has no value-dependent shape
    padding = np.argsort(inside, kind='stable')[:hp * wp - height * width]
    return _on_device(slots, device), _on_device(padding, device)
