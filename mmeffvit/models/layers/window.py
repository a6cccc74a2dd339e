"""Padding and window partition helpers of the windowed-attention backbones.

Non-overlapping ``w×w`` (or ``wh×ww``: every ``window`` argument takes an int or an
``(h, w)`` pair) windows of a channels-last map, row-major over the window grid and
row-major inside each window, as in Swin (Liu et al., ICCV 2021, sec. 3.2) and the Focal
Transformer / L²ViT windows built on it. Maps are zero-padded at the bottom/right, so any
``H×W`` works; callers crop back to ``H×W`` after :func:`window_reverse`.
"""
import torch.nn.functional as F


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
    """Inverse of :func:`window_partition`: either layout back to a ``(B, Hp, Wp, C)`` map."""
    wh, ww = _pair(window)
    gh, gw = hp // wh, wp // ww
    if windows.dim() == 5:  # (B, nW, h, wh·ww, d)
        b, _, h, _, d = windows.shape
        x = windows.reshape(b, gh, gw, h, wh, ww, d).permute(0, 1, 4, 2, 5, 3, 6)
        return x.reshape(b, hp, wp, h * d)
    c = windows.shape[-1]
    x = windows.reshape(-1, gh, gw, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, hp, wp, c)
