"""Relative position bias of windowed attention (Swin, Liu et al., ICCV 2021, sec. 3.2).

The index of every (query, key) pair of a window into a learned table of relative offsets,
the additive mask of shifted windows, the bicubic resize of a table to another window, and
Swin's window multi-head self-attention that uses them (FLatten-Swin's ``'S'`` stages,
L²ViT's local windows without the bias, the Focal Transformer's window table). The attention
itself is :func:`mmeffvit.ops.window_attention`.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import ops
from ...ops.window_attention import window_attention_mask
from ...utils import square_side
from ...utils.geometry_cache import GeometryCache, geometry_cached
from ...utils.geometry_cache import parameter_cache_allowed as cache_allowed
from ...utils.geometry_cache import parameter_key as tables_key
from .linear import Linear, project_heads


#: additive logit given to key/query pairs of one shifted window that come from different
#: regions of the map (Swin's value: negligible after the softmax, finite in fp16/bf16)
SHIFT_MASK_VALUE = -100.0


def relative_position_index(window, table_window=None):
    """Index of every (query, key) pair of a ``window×window`` window into a bias table.

    The table holds one row per relative offset ``(dy, dx)`` with ``|dy|, |dx| < table_window``,
    row-major over ``(dy + W - 1, dx + W - 1)`` with ``W = table_window`` (Swin, sec. 3.2).
    ``window < table_window`` addresses the central part of a larger table.

    Returns:
        LongTensor: ``(window², window²)``.
    """
    big = window if table_window is None else table_window
    if window > big:
        raise ValueError(f'window {window} is larger than the bias table window {big}')
    ys, xs = torch.meshgrid(torch.arange(window), torch.arange(window), indexing='ij')
    ys, xs = ys.flatten(), xs.flatten()
    dy = ys[:, None] - ys[None, :] + big - 1
    dx = xs[:, None] - xs[None, :] + big - 1
    return dy * (2 * big - 1) + dx


def shifted_window_mask(height, width, window, shift, device=None):
    """Additive mask ``(num_windows, window², window²)`` of shifted-window attention.

    After the cyclic shift by ``-shift`` of the padded ``height×width`` map, its last ``shift``
    rows are the rows wrapped around from the top, which share the last row of windows with
    rows from the bottom. Rows of the shifted map are labelled by strip (``[0, H-w)``,
    ``[H-w, H-s)``, ``[H-s, H)``), columns likewise, and pairs of tokens whose (row, column)
    labels differ get :data:`SHIFT_MASK_VALUE`.
    """

    def strips(size):  # on the host: a table of the geometry alone
        return (np.arange(size) >= size - window).astype(np.int64) + (
            np.arange(size) >= size - shift)

    region = strips(height)[:, None] * 3 + strips(width)[None, :]
    region = region.reshape(height // window, window, width // window, window)
    region = region.transpose(0, 2, 1, 3).reshape(-1, window * window)
    differs = region[:, :, None] != region[:, None, :]
    mask = np.where(differs, np.float32(SHIFT_MASK_VALUE), np.float32(0))
    return torch.from_numpy(np.ascontiguousarray(mask, dtype=np.float32)).to(device)


@geometry_cached(maxsize=32)
def cached_shifted_window_mask(height, width, window, shift, device=None):
    """:func:`shifted_window_mask`, built once per geometry and device (shared: read only)."""
    return shifted_window_mask(height, width, window, shift, device)


class WindowMSA(nn.Module):
    """Softmax self-attention inside windows with a relative position bias (Swin, sec. 3.2).

    The ``'S'`` attention of FLatten-Swin, unchanged from Swin; without ``window_size`` the
    plain window attention of L²ViT (no bias: its position cue comes from the CPEs, sec. 3.1).
    Parameter and buffer names (``qkv``, ``proj``, ``relative_position_bias_table``,
    ``relative_position_index``) are the official ones so the released checkpoints load.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads h.
        window_size (int | None): Window side w the bias table is built for, ``(2w-1)² × h``;
            None builds no table and adds no bias.
        qkv_bias (bool): Bias of the fused q/k/v projection.
        attn_drop (float): Dropout on the attention weights.
        proj_drop (float): Dropout after the output projection.
    """

    def __init__(self, embed_dims, num_heads, window_size=None, qkv_bias=True, attn_drop=0.,
                 proj_drop=0.):
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims {embed_dims} is not divisible by num_heads {num_heads}')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.window_size = window_size
        self.qk_scale = (embed_dims // num_heads) ** -0.5
        if window_size is not None:
            self.relative_position_bias_table = nn.Parameter(
                torch.zeros((2 * window_size - 1) ** 2, num_heads))
            self.register_buffer('relative_position_index', relative_position_index(window_size))
        self.qkv = Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)
        # run-time caches (not state): bias index per smaller window; in eval the finished
        # additive mask per (window, shift mask, dtype, images, table version)
        self._index_cache = GeometryCache(maxsize=8)
        self._mask_cache = {}

    def relative_bias(self, window):
        """``(h, window², window²)`` bias for a window of side ``window`` (≤ the table's)."""
        table = self.relative_position_bias_table
        if window == self.window_size:
            index = self.relative_position_index
        else:
            index = self._index_cache((window, table.device), lambda: relative_position_index(
                window, self.window_size).to(table.device))
        bias = table[index.reshape(-1)]
        return bias.reshape(window * window, window * window, -1).permute(2, 0, 1)

    def attention_mask(self, window, mask, dtype, images):
        """Additive float mask ``(images·nW | 1, h, w², w²)`` of the fused attention: relative
        bias plus shift mask, or None when there is neither.

        In eval (no autograd through the table) it is built once per geometry and table
        version and reused; in training the bias is gathered from the table every call, so
        that the table gets its gradient. The shift ``mask`` must be a tensor that is reused
        across calls (:func:`cached_shifted_window_mask`) for the cache to hit.
        """
        has_table = self.window_size is not None
        if not has_table and mask is None:
            return None
        tables = (self.relative_position_bias_table, ) if has_table else ()
        cacheable = cache_allowed(*tables)
        if cacheable:
            key = (window, id(mask), dtype, images) + tables_key(*tables)
            hit = self._mask_cache.get(key)
            if hit is not None and hit[0] is mask:
                return hit[1]
        bias = self.relative_bias(window)[None] if has_table else None
        if mask is not None:
            bias = mask[:, None] if bias is None else bias + mask[:, None]
        bias = window_attention_mask(bias.to(dtype), images)
        if cacheable:
            if len(self._mask_cache) >= 8:  # a few geometries live at a time
                self._mask_cache.clear()
            self._mask_cache[key] = (mask, bias)  # holding mask keeps its id unique
        return bias

    def forward(self, x, window=None, mask=None):
        """Args: x ``(B·nW, w², C)`` window tokens of side ``window`` (for the bias); mask
        ``(nW, w², w²)`` or None. Returns ``(B·nW, w², C)``."""
        q, k, v = project_heads(self.qkv, x, 3, self.num_heads)
        return self.proj_drop(self.proj(self.attend(q, k, v, window, mask)))

    def attend(self, q, k, v, window=None, mask=None):
        """``softmax(q·kᵀ·d^-1/2 + bias + mask)·v`` on per-head ``(B·nW, h, w², d)`` windows
        (sec. 3.2, Eq. 4), heads merged into ``(B·nW, w², C)``, before ``proj`` (callers that
        project outside the windows call this and ``proj`` themselves).

        While the table is trained its bias and the shift mask go to
        :func:`mmeffvit.ops.window_attention` apart (the bias gradient is its own); otherwise
        their sum, cached in eval (:meth:`attention_mask`).
        """
        bw, h, n, _ = q.shape
        images = 1 if mask is None else bw // mask.shape[0]
        drop = self.attn_drop.p if self.training else 0.
        if self.window_size is not None and not cache_allowed(self.relative_position_bias_table):
            bias = self.relative_bias(window)[None].to(q.dtype)
            if mask is not None:
                mask = window_attention_mask(mask[:, None].to(q.dtype), images)
            out = ops.window_attention(q, k, v, mask, self.qk_scale, bias=bias, dropout=drop)
        else:
            attn_mask = self.attention_mask(window, mask, q.dtype, images)
            out = ops.window_attention(q, k, v, attn_mask, self.qk_scale, dropout=drop)
        return out.reshape(bw, n, -1)


def resize_bias_table(table, rows, what='relative_position_bias_table'):
    """Bicubic resize of a ``((2w-1)², h)`` relative bias table to ``rows`` = ``(2w'-1)²``.

    Any square table works (Focal's pooled tables, whose sides need not be ``2w-1``); timm's
    ``resize_rel_pos_bias_table_simple`` takes a window and assumes ``2w-1``. Runs in fp32.
    """
    src, dst = square_side(table.shape[0], what), square_side(rows, what)
    grid = table.t().reshape(1, -1, src, src).float()
    grid = F.interpolate(grid, size=(dst, dst), mode='bicubic', align_corners=False)
    return grid.reshape(-1, dst * dst).t().contiguous().to(table.dtype)
