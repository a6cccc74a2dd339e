"""Focal Transformer: focal self-attention as a dense-prediction backbone (NeurIPS 2021).

Yang et al., "Focal Self-attention for Local-Global Interactions in Vision Transformers",
arXiv 2107.00641, sec. 3 (focal self-attention, Fig. 2-3) and sec. 4 (model variants).
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.logging import print_log
from mmengine.model.weight_init import trunc_normal_
from timm.layers import DropPath

from ... import ops
from ...ops.window_attention import reused_gather_buffer
from ...registry import register_model
from ...utils import tokens_to_contiguous_map, unknown_choice_error
from ...utils.geometry_cache import GeometryCache
from ..layers import LayerNormFP32, PatchEmbed
from ..layers.linear import Linear, Mlp, mlp_residual
from ..layers.relative_position import (cache_allowed, relative_position_index,
                                        resize_bias_table, tables_key)
from ..layers.window import pad_to_windows, window_partition, window_reverse
from .base import EffBackbone, resolve_arch

#: additive logit of the official code for pooled keys read outside the pooled map
OFFICIAL_MASK_VALUE = -100.0

POOL_METHODS = ('fc', 'mean', 'max', 'conv')
_NEIGHBOUR_TABLE = '.relative_position_bias_table_to_neighbors'


def ring_slots(window, expand):
    """Kept (row, col, dy, dx) slots of the four diagonally rolled windows (sec. 3.2, level 0).

    The surroundings of a window are read from four copies of the key map rolled by
    ``(±e, ±e)``; from each rolled window only the positions that fall outside the window
    itself are kept (last/first ``e`` rows or columns), in the order top-left, top-right,
    bottom-left, bottom-right, row-major. ``(dy, dx)`` is the offset from the slot to the key
    it reads (``-roll shift``). Returns a LongTensor ``(4w² - 4(w-e)², 4)``.
    """
    rows = []
    e, w = expand, window
    for sy, sx in ((-e, -e), (-e, e), (e, -e), (e, e)):
        keep = np.ones((w, w), dtype=bool)
        # drop the part of the rolled window that overlaps the window itself
        keep[slice(None, -e) if sy < 0 else slice(e, None),
             slice(None, -e) if sx < 0 else slice(e, None)] = False
        # kept slots in row-major order by a stable sort, not a search: a constant table whose
        # size a trace knows from the sizes, and no tensor data read on a device
        kept = np.argsort(~keep.ravel(), kind='stable')[:w * w - (w - e) ** 2]
        ii, jj = kept // w, kept % w
        rows.append(np.stack([ii, jj, np.full_like(ii, -sy), np.full_like(jj, -sx)], 1))
    return torch.from_numpy(np.concatenate(rows).astype(np.int64))


def pooled_relative_index(window, region):
    """Index ``(w², region²)`` of (query in window, key in the pooled region) into a table of
    ``(w + region - 1)²`` rows (official ``relative_position_index_k`` layout)."""
    qy, qx = torch.meshgrid(torch.arange(window), torch.arange(window), indexing='ij')
    ky, kx = torch.meshgrid(torch.arange(region), torch.arange(region), indexing='ij')
    dy = qy.flatten()[:, None] - ky.flatten()[None] + region - 1
    dx = qx.flatten()[:, None] - kx.flatten()[None] + region - 1
    return dy * (window + region - 1) + dx


def centre_fit(x, height, width):
    """Centre-crop or centre-zero-pad ``x (B, H, W, ...)`` to ``height × width`` (official)."""
    for dim, size in ((1, height), (2, width)):
        cur = x.shape[dim]
        if cur > size:
            start = (cur - size) // 2
            x = x.narrow(dim, start, size)
        elif cur < size:
            before = (size - cur) // 2
            pad = [0, 0] * (x.dim() - dim - 1) + [before, size - cur - before]
            x = F.pad(x, pad)
    return x


class FocalAttention(nn.Module):
    """Focal self-attention of one window size, its surroundings and pooled levels (sec. 3.2).

    Keys of a ``w×w`` query window, concatenated and attended with **one** softmax:

    1. the window's own ``w²`` tokens, biased by a Swin table ``relative_position_bias_table``;
    2. (``expand_size`` e > 0) the surrounding ring of width ``e``, gathered as the official
       code does with four diagonal rolls: ``4w² - 4(w-e)²`` keys (132 for w=7, e=3: the
       120-token ring plus 12 duplicates), biased by the dense
       ``relative_position_bias_table_to_neighbors`` ``(1, h, w², 132)``;
    3. for each pooled level k (``focal_level - 1`` of them): the ``(fw + 2^k - 1)²`` pooled
       sub-window tokens around the window (unfold with stride ``2^k``), biased by
       ``relative_position_bias_table_to_windows.k`` ``(h, (w + fw + 2^k - 2)²)``.

    Pooled tokens are projected by the same ``qkv`` as the fine tokens (the q part is unused).
    The key set is gathered with one precomputed index per map geometry (see
    :meth:`FocalTransformerBlock.geometry`), equivalent to the official rolls and unfolds; in
    CPU inference :func:`mmeffvit.ops.gathered_window_attention` reads the keys through that
    index instead of gathering them.
    """

    def __init__(self, dim, num_heads, window_size=7, expand_size=3, focal_level=2,
                 focal_window=7, qkv_bias=True, attn_drop=0., proj_drop=0.):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'embed_dims {dim} is not divisible by num_heads {num_heads}')
        if not 0 <= expand_size < window_size:
            raise ValueError(f'expand_size {expand_size} must lie in [0, window_size)')
        if focal_window < 1 or focal_window % 2 == 0:
            raise ValueError(f'focal_window must be odd and >= 1, got {focal_window}')
        self.dim, self.num_heads = dim, num_heads
        self.window_size, self.expand_size = window_size, expand_size
        self.focal_level, self.focal_window = focal_level, focal_window
        self.scale = (dim // num_heads) ** -0.5
        w = window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * w - 1) ** 2, num_heads))
        self.register_buffer('relative_position_index', relative_position_index(w))
        if expand_size > 0:
            slots = ring_slots(w, expand_size)
            self.relative_position_bias_table_to_neighbors = nn.Parameter(
                torch.zeros(1, num_heads, w * w, len(slots)))
            # initialised here too (as the official constructor), so a table that a
            # pretrained checkpoint lacks (stage 4 at 224²) starts from the same distribution
            trunc_normal_(self.relative_position_bias_table_to_neighbors, std=.02)
            # official buffer: positions kept from the four stacked rolled windows
            keep = (slots[:, 0] * w + slots[:, 1]) + w * w * torch.arange(4).repeat_interleave(
                len(slots) // 4)
            self.register_buffer('valid_ind_rolled', keep)
        self.relative_position_bias_table_to_windows = nn.ParameterList()
        for k in range(focal_level - 1):
            region = focal_window + 2 ** k - 1
            table = nn.Parameter(torch.zeros(num_heads, (w + region - 1) ** 2))
            trunc_normal_(table, std=.02)
            self.relative_position_bias_table_to_windows.append(table)
            self.register_buffer(f'relative_position_index_{k}', pooled_relative_index(w, region))
            if k > 0:
                size = focal_window + 2 * 2 ** k - 2
                mask = torch.zeros(size, size)
                mask[2 ** k - 1:, 2 ** k - 1:] = 1
                self.register_buffer(f'valid_ind_unfold_{k}', mask.flatten().nonzero().view(-1))
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self._bias_cache = {}  # run-time cache of key_bias() in eval (not state)

    def bias_tables(self):
        tables = [self.relative_position_bias_table]
        if self.expand_size > 0:
            tables.append(self.relative_position_bias_table_to_neighbors)
        return tables + list(self.relative_position_bias_table_to_windows)

    def cached_key_bias(self, dtype):
        """:meth:`key_bias` in ``dtype``, gathered once per table version (only where no
        gradient flows to the tables). The sum with the per-window key mask is not cached: it
        would keep a map as large as the scores per block."""
        tables = self.bias_tables()
        key = (dtype, ) + tables_key(*tables)
        if self._bias_cache.get('key') != key:
            self._bias_cache = dict(key=key, bias=self.key_bias().to(dtype))
        return self._bias_cache['bias']

    def key_bias(self):
        """``(h, w², N)`` relative position bias of every key slot, in key order."""
        w2 = self.window_size ** 2
        table = self.relative_position_bias_table[self.relative_position_index.reshape(-1)]
        parts = [table.reshape(w2, w2, -1).permute(2, 0, 1)]
        if self.expand_size > 0:
            parts.append(self.relative_position_bias_table_to_neighbors[0])
        for k, tab in enumerate(self.relative_position_bias_table_to_windows):
            index = getattr(self, f'relative_position_index_{k}')
            parts.append(tab[:, index.reshape(-1)].reshape(self.num_heads, w2, -1))
        return torch.cat(parts, -1)

    def forward(self, x, pooled, index, key_mask):
        """Args:
            x (Tensor): ``(B, Hp, Wp, C)`` normalised map padded to window multiples.
            pooled (list[Tensor]): ``(B, h_k, w_k, C)`` pooled map of each level.
            index (LongTensor): ``(nW, N)`` key of every (window, slot) in the token bank
                ``[fine map | pooled level 0 | ... | zero token]``.
            key_mask (Tensor): ``(nW, N)`` additive logit per key (0, -100 or -inf).

        Returns:
            Tensor: ``(B, Hp, Wp, C)``.
        """
        b, hp, wp, c = x.shape
        h, w = self.num_heads, self.window_size
        d = c // h
        # split rather than indexing: its backward joins the gradients in one tensor, where
        # each index's backward fills a zero tensor of the whole input and the pieces are added
        q, kv = self.qkv(x).reshape(b, hp * wp, 3, c).split([1, 2], 2)
        # one bank of (k, v) pairs, gathered by one index_select: measured faster, forward and
        # backward, than indexing k and v banks apart or each bank apart and joining the gathers
        banks = [kv] + [self.qkv(p).reshape(b, -1, 3, c).split([1, 2], 2)[1] for p in pooled]
        bank = torch.cat(banks + [kv.new_zeros(b, 1, 2, c)], 1)  # last: the zero token
        nw = index.shape[0]
        q = window_partition(q.reshape(b, hp, wp, c), w, num_heads=h)
        q = q.reshape(b * nw, h, w * w, d)
        drop = self.attn_drop.p if self.training else 0.
        # the tables' bias gathered once per table version where they get no gradient
        tables = self.bias_tables()
        bias = self.cached_key_bias(q.dtype) if cache_allowed(*tables) else self.key_bias()
        out = ops.gathered_window_attention(q, bank, index, bias, key_mask, self.scale,
                                            dropout=drop)
        return self.proj_drop(self.proj(window_reverse(out, w, hp, wp)))


class FocalTransformerBlock(nn.Module):
    """Pre-norm block: focal self-attention and MLP, each with a residual (sec. 3, Fig. 3).

    The normalised map is zero-padded at the bottom/right to window multiples; each pooled
    level k centre-crops/pads it to ``(Hp/w)·2^k`` sub-windows of side ``floor(w / 2^k)`` and
    pools each sub-window to one token (``pool_method``; the released models use 'fc', a
    learned ``Linear(side², 1)`` shared by all channels, ``pool_layers.k``).

    Borders (``mask_borders``):

    - ``True`` (default, for dense prediction): a key is excluded (``-inf``) when it lies
      outside the ``H×W`` map: in the bottom/right padding, beyond an image border in the
      surroundings (the official rolls would wrap it around from the opposite border), or a
      pooled neighbour outside the pooled map or made only of padding. Pooled tokens that
      straddle the border keep their zero-padded average, as in the official code.
    - ``False`` (the official code, for checkpoint fidelity): the surroundings wrap around
      the padded map, padded tokens are ordinary keys, and only pooled neighbours outside the
      pooled map get ``-100``.

    Unlike the official code the window is never shrunk to a small map (such maps are padded),
    so parameter shapes never depend on the input size; no Swin shift (no released model
    uses one).
    """

    def __init__(self, dim, num_heads, window_size=7, expand_size=3, focal_level=2,
                 focal_window=7, pool_method='fc', mlp_ratio=4., qkv_bias=True, drop=0.,
                 attn_drop=0., drop_path=0., mask_borders=True):
        super().__init__()
        if pool_method not in POOL_METHODS:
            raise unknown_choice_error('pool_method', pool_method, POOL_METHODS)
        if focal_level < 1:
            raise ValueError(f'focal_level must be >= 1, got {focal_level}')
        self.window_size, self.expand_size = window_size, expand_size
        self.focal_level, self.focal_window = focal_level, focal_window
        self.pool_method, self.mask_borders = pool_method, mask_borders
        self.pool_layers = nn.ModuleList()
        for k in range(focal_level - 1):
            side = window_size // 2 ** k
            if pool_method == 'fc':
                layer = nn.Linear(side * side, 1)
                nn.init.constant_(layer.weight, 1. / (side * side))  # a mean before training
                nn.init.zeros_(layer.bias)
                self.pool_layers.append(layer)
            elif pool_method == 'conv':
                self.pool_layers.append(nn.Conv2d(dim, dim, side, stride=side, groups=dim))
        self.norm1 = LayerNormFP32(dim)
        self.attn = FocalAttention(dim, num_heads, window_size, expand_size, focal_level,
                                   focal_window, qkv_bias=qkv_bias, attn_drop=attn_drop,
                                   proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = LayerNormFP32(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)

    def geometry_key(self, hw_shape):
        return (tuple(hw_shape), self.window_size, self.expand_size, self.focal_level,
                self.focal_window, self.mask_borders)

    @torch.no_grad()
    def geometry(self, hw_shape, device=None):
        """Key index ``(nW, N)`` into the token bank and additive key mask ``(nW, N)``."""
        height, width = hw_shape
        w, e = self.window_size, self.expand_size
        gh, gw = math.ceil(height / w), math.ceil(width / w)
        hp, wp = gh * w, gw * w
        wy = torch.arange(gh, device=device)[:, None, None] * w
        wx = torch.arange(gw, device=device)[None, :, None] * w
        ii, jj = torch.meshgrid(torch.arange(w, device=device), torch.arange(w, device=device),
                                indexing='ij')
        sy, sx = ii.flatten(), jj.flatten()
        if e > 0:
            ring = ring_slots(w, e).to(device)
            sy = torch.cat([sy, ring[:, 0] + ring[:, 2]])
            sx = torch.cat([sx, ring[:, 1] + ring[:, 3]])
        rows, cols = wy + sy, wx + sx  # unwrapped positions (gh, gw, S)
        index = [(rows % hp) * wp + cols % wp]
        inside = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
        valid = [inside]
        offset = hp * wp
        sizes = []
        for k in range(self.focal_level - 1):
            sizes.append((gh * 2 ** k, gw * 2 ** k))
            offset_k = offset + sum(a * b for a, b in sizes[:-1])
            s = 2 ** k
            kernel = 2 * (self.focal_window // 2) + 2 * s - 1
            u = torch.arange(s - 1, kernel, device=device)  # kept part of the unfold kernel
            pr = torch.arange(gh, device=device)[:, None] * s - kernel // 2 + u[None]
            pc = torch.arange(gw, device=device)[:, None] * s - kernel // 2 + u[None]
            pr, pc = pr[:, None, :, None], pc[None, :, None, :]  # (gh, 1, K', 1), (1, gw, 1, K')
            ph, pw = sizes[-1]
            on_map = (pr >= 0) & (pr < ph) & (pc >= 0) & (pc < pw)
            idx = offset_k + pr.clamp(0, ph - 1) * pw + pc.clamp(0, pw - 1)
            index.append(torch.where(on_map, idx, torch.full_like(idx, -1)).flatten(2))
            # pooled tokens that contain at least one image token
            side = w // s
            img = torch.zeros(1, hp, wp, 1, device=device)
            img[:, :height, :width] = 1
            img = centre_fit(img, ph * side, pw * side).reshape(ph, side, pw, side)
            has_image = img.amax((1, 3)) > 0
            usable = on_map & has_image[pr.clamp(0, ph - 1), pc.clamp(0, pw - 1)]
            valid.append((usable if self.mask_borders else on_map).flatten(2))
        total = offset + sum(a * b for a, b in sizes)
        index = torch.cat([i.expand(gh, gw, -1) for i in index], -1).reshape(gh * gw, -1)
        valid = torch.cat([v.expand(gh, gw, -1) for v in valid], -1).reshape(gh * gw, -1)
        index = torch.where(index < 0, torch.full_like(index, total), index)  # zero token
        if self.mask_borders:
            mask = torch.zeros(valid.shape, device=device).masked_fill(~valid, float('-inf'))
        else:
            mask = torch.zeros(valid.shape, device=device)
            n_fine = w * w + (len(ring_slots(w, e)) if e > 0 else 0)
            mask[:, n_fine:] = (~valid[:, n_fine:]).float() * OFFICIAL_MASK_VALUE
        return index, mask

    def pool(self, x, k):
        """Pooled map ``(B, h_k, w_k, C)`` of level ``k`` from the padded map ``x``."""
        b, hp, wp, c = x.shape
        w = self.window_size
        side = w // 2 ** k
        ph, pw = hp // w * 2 ** k, wp // w * 2 ** k
        x = centre_fit(x, ph * side, pw * side).reshape(b, ph, side, pw, side, c)
        if self.pool_method == 'fc':
            x = x.permute(0, 1, 3, 5, 2, 4).reshape(b, ph, pw, c, side * side)
            return self.pool_layers[k](x).squeeze(-1)
        if self.pool_method == 'mean':
            return x.mean((2, 4))
        if self.pool_method == 'max':
            return x.amax((2, 4))
        x = x.permute(0, 1, 3, 5, 2, 4).reshape(b * ph * pw, c, side, side)
        return self.pool_layers[k](x).reshape(b, ph, pw, c)

    def forward(self, x, hw_shape, geometry=None):
        b, n, c = x.shape
        height, width = hw_shape
        if geometry is None:
            geometry = self.geometry(hw_shape, x.device)
        w = self.window_size
        y = self.norm1(x).view(b, height, width, c)
        y = pad_to_windows(y, w)
        pooled = [self.pool(y, k) for k in range(self.focal_level - 1)]
        y = self.attn(y, pooled, *geometry)
        y = y[:, :height, :width].reshape(b, n, c)
        x = x + self.drop_path(y)
        return mlp_residual(x, self.norm2, self.mlp, self.drop_path, owned=True)


def focal_patch_embed(in_channels, embed_dims, stride, conv=False, stem=False):
    """Stem / downsampling of the official ``PatchEmbed``: ``Conv`` (k = s, or the overlapping
    k7/s4/p2 stem and k3/s2/p1 downsampling convs of the conv variants) then LayerNorm.

    The input is zero-padded at the bottom/right to a multiple of the stride, so a ``H×W`` map
    becomes ``ceil(H/s)×ceil(W/s)`` for both variants; at multiples of the stride this is
    exactly the official layer.
    """
    if conv:
        kernel, padding = (7, 2) if stem else (3, 1)
    else:
        kernel, padding = stride, 0
    return PatchEmbed(in_channels, embed_dims, kernel, stride, padding=padding)


class FocalStage(nn.Module):
    """One stage: ``blocks`` then the optional ``downsample`` (official ``BasicLayer`` names)."""

    def __init__(self, blocks, downsample=None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


@register_model
class FocalTransformer(EffBackbone):
    """Focal Transformer backbone (Yang et al., NeurIPS 2021, sec. 3-4, Table 1).

    Four stages of :class:`FocalTransformerBlock` at strides 4/8/16/32; the stem and the
    downsampling layers are patch embeddings (``Conv`` k=s=4 / k=s=2, or with
    ``use_conv_embed`` the overlapping k7/s4/p2 and k3/s2/p1 convs), each followed by a
    LayerNorm; the downsample of stage i sits in ``layers.i.downsample`` as in the official
    code, and each output is taken before it. Parameter names are the official ones, so the
    official ImageNet checkpoints (``'model'`` layout) load with ``init_cfg=Pretrained``.

    Dense prediction (the official model asserts its training size and fixes windows at
    construction): any ``H×W`` (``ceil`` per stride), maps padded to window multiples at run
    time, keys outside the map masked by default (``mask_borders``; see
    :class:`FocalTransformerBlock` for the official wrap-around behaviour), the window never
    shrunk. Stage 4: the official model built at 224² has a 7×7 stage-4 map, for which it
    turns the surroundings off, so its checkpoints lack stage 4's
    ``relative_position_bias_table_to_neighbors``. With the default ``expand_sizes``
    (3, 3, 3, 3) that table is kept at its random initialisation when such a checkpoint is
    loaded (a log line says so); ``expand_sizes=(3, 3, 3, 0)`` reproduces the 224² structure
    exactly instead. ``final_norm=True`` builds the classifier's final ``norm`` instead of the
    out-norms (classification, see :class:`EffBackbone`; with ``expand_sizes=(3, 3, 3, 0)`` and
    ``mask_borders=False`` it is the official classifier at 224²).

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'`` (or ``t/s/b``), or a dict with
            ``embed_dims``, ``depths``, ``num_heads`` (and optionally ``drop_path_rate``).
        in_channels (int): Input channels.
        use_conv_embed (bool): Overlapping conv patch embeddings (the "conv" variants).
        window_size (int): Window side w (7).
        expand_sizes (Sequence[int]): Width of the fine surroundings per stage (3).
        focal_levels (Sequence[int]): Levels per stage, fine level included (2 = one pooled
            level, the released models).
        focal_windows (Sequence[int]): Pooled neighbourhood side per stage (7, 5, 3, 1).
        pool_method (str): 'fc' (released), 'mean', 'max' or 'conv'.
        mask_borders (bool): Mask keys outside the map (default) or wrap as the official code.
        mlp_ratio (float): MLP hidden ratio.
        qkv_bias (bool): Bias of the q/k/v projection.
        drop_rate (float): Dropout after embeddings, projections and MLPs.
        attn_drop_rate (float): Dropout on the attention weights.
        drop_path_rate (float, optional): Stochastic depth, linear over all blocks; None takes
            the arch's ImageNet value (0.2 / 0.3 / 0.5).
        out_indices (Sequence[int]): Stages to output (0-based).
        final_norm (bool): Classification: the official final ``norm`` on the last stage
            instead of the out-norms (:class:`EffBackbone`).
        frozen_stages (int): See :class:`EffBackbone`; stage i includes its downsample.
        norm_eval (bool): See :class:`EffBackbone`.
        with_cp (bool): Gradient checkpointing of every block.
        init_cfg (dict | list, optional): ``dict(type='Pretrained', checkpoint=...)``.

    Example:
        >>> import torch
        >>> from mmeffvit.models import FocalTransformer
        >>> model = FocalTransformer(arch='tiny').eval()
        >>> outs = model(torch.rand(1, 3, 333, 517))
        >>> [tuple(o.shape) for o in outs]
        [(1, 96, 84, 130), (1, 192, 42, 65), (1, 384, 21, 33), (1, 768, 11, 17)]
    """

    arch_settings = {
        'tiny': dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                     drop_path_rate=0.2),
        'small': dict(embed_dims=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24],
                      drop_path_rate=0.3),
        'base': dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
                     drop_path_rate=0.5),
    }
    arch_aliases = {'t': 'tiny', 's': 'small', 'b': 'base'}
    # tensors are selected by exact key ends (a substring match on
    # relative_position_bias_table would also hit the 4-D neighbour and the pooled tables);
    # index buffers come from this model; tables and fc pooling weights are resized when the
    # window or the focal window differ
    ckpt_drop_prefixes = ('head.', 'norm.')
    ckpt_drop_suffixes = ('attn_mask', )
    ckpt_own_leaves = ('relative_position_index', 'valid_ind_')
    ckpt_resize_rules = (
        (r'\.relative_position_bias_table$', 'bias_table'),
        (r'\.relative_position_bias_table_to_windows\.\d+$', 'bias_table', dict(transposed=True)),
        (r'\.pool_layers\.\d+\.weight$', 'pool_weights'))
    final_norm_cfg = dict(eps=1e-5)  # official nn.LayerNorm

    def __init__(self,
                 arch='tiny',
                 in_channels=3,
                 use_conv_embed=False,
                 window_size=7,
                 expand_sizes=(3, 3, 3, 3),
                 focal_levels=(2, 2, 2, 2),
                 focal_windows=(7, 5, 3, 1),
                 pool_method='fc',
                 mask_borders=True,
                 mlp_ratio=4.,
                 qkv_bias=True,
                 drop_rate=0.,
                 attn_drop_rate=0.,
                 drop_path_rate=None,
                 out_indices=(0, 1, 2, 3),
                 final_norm=False,
                 frozen_stages=-1,
                 norm_eval=False,
                 with_cp=False,
                 init_cfg=None):
        super().__init__(frozen_stages=frozen_stages, norm_eval=norm_eval, init_cfg=init_cfg,
                         final_norm=final_norm)
        arch = resolve_arch(arch, self.arch_settings, self.arch_aliases,
                            required=('embed_dims', 'depths', 'num_heads'))
        depths, num_heads = list(arch['depths']), list(arch['num_heads'])
        num = len(depths)
        per_stage = dict(num_heads=num_heads, expand_sizes=expand_sizes,
                         focal_levels=focal_levels, focal_windows=focal_windows)
        for name, value in per_stage.items():
            if len(value) != num:
                raise ValueError(f'{name} has {len(value)} entries for {num} stages')
        if int(window_size) < 1:
            raise ValueError(f'window_size must be >= 1, got {window_size}')
        out_indices = tuple(out_indices)
        if not out_indices or any(not 0 <= i < num for i in out_indices):
            raise ValueError(f'out_indices must be a non-empty subset of 0..{num - 1}, '
                             f'got {out_indices}')
        if drop_path_rate is None:
            drop_path_rate = arch.get('drop_path_rate', 0.1)
        self.arch = arch
        self.depths = depths
        self.embed_dims = [int(arch['embed_dims']) * 2 ** i for i in range(num)]
        self.out_indices = out_indices
        self.with_cp = with_cp
        self.num_stages = num
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()

        self.patch_embed = focal_patch_embed(in_channels, self.embed_dims[0], 4, use_conv_embed,
                                             stem=True)
        self.pos_drop = nn.Dropout(drop_rate)
        self.layers = nn.ModuleList()
        for i in range(num):
            dims, start = self.embed_dims[i], sum(depths[:i])
            blocks = [
                FocalTransformerBlock(
                    dims, num_heads[i], window_size=int(window_size),
                    expand_size=int(expand_sizes[i]), focal_level=int(focal_levels[i]),
                    focal_window=int(focal_windows[i]), pool_method=pool_method,
                    mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop=drop_rate,
                    attn_drop=attn_drop_rate, drop_path=dpr[start + j], mask_borders=mask_borders)
                for j in range(depths[i])
            ]
            down = focal_patch_embed(dims, 2 * dims, 2, use_conv_embed) if i < num - 1 else None
            self.layers.append(FocalStage(blocks, down))
        self._geometry_cache = GeometryCache(maxsize=16)  # run-time, not state; see forward
        for i in out_indices:
            self.add_module(f'norm{i}', self.out_norm_layer(self.embed_dims[i]))
        self.add_final_norm(self.embed_dims[-1])
        self._freeze_stages()

    def stage_modules(self, index):
        if index < 0:
            return [self.patch_embed]
        return [self.layers[index], getattr(self, f'norm{index}', None)]

    def init_random_extras(self):
        # official init: the surrounding and pooled tables are trunc-normal, the window table
        # stays zero; pool_layers keep the default rule's trunc-normal (the model-level
        # official init also overwrites their 1/side² start)
        for m in self.modules():
            if isinstance(m, FocalAttention):
                if m.expand_size > 0:
                    trunc_normal_(m.relative_position_bias_table_to_neighbors, std=.02)
                for tab in m.relative_position_bias_table_to_windows:
                    trunc_normal_(tab, std=.02)

    def convert_weights(self, state_dict):
        """The declared conversion (``ckpt_*``), except for the ``…_to_neighbors`` tables.

        Those have no 2-D offset structure to resize: one that does not fit, or that the
        checkpoint lacks (stage 4 of 224² checkpoints), keeps this model's initialisation.
        """
        own = self.state_dict()
        misfit = [k for k, v in state_dict.items() if k.endswith(_NEIGHBOUR_TABLE)
                  and k in own and own[k].shape != v.shape]
        out = super().convert_weights({k: v for k, v in state_dict.items() if k not in misfit})
        fresh = set(misfit)
        if any(k in own for k in out):
            fresh.update(k for k in own if k.endswith(_NEIGHBOUR_TABLE) and k not in out)
        if fresh:
            print_log(f'{type(self).__name__}: {len(fresh)} relative_position_bias_table_to_'
                      f'neighbors tables are not in the checkpoint (or do not fit) and keep '
                      f'their random initialisation: {sorted(fresh)}', logger='current')
        return out

    def _resize_pool_weights(self, key, value, target):
        """fc pooling weights over a ``side²`` sub-window: resized on the ``side×side`` grid and
        rescaled so that they keep their sum (a mean stays a mean)."""
        if value.dim() != 2:
            return value
        rows = resize_bias_table(value.t(), target.shape[1], key).t()
        return rows * (value.shape[1] / target.shape[1])

    def forward(self, x):
        with reused_gather_buffer():  # every block's gathered keys in one buffer
            return self._forward(x)

    def _forward(self, x):
        x, hw = self.patch_embed(x)
        x = self.pos_drop(x)
        outs = []
        cache = self._geometry_cache
        for i, layer in enumerate(self.layers):
            for blk in layer.blocks:
                # one index per geometry, shared by the blocks and kept across calls
                geometry = cache((blk.geometry_key(hw), x.device),
                                 lambda: blk.geometry(hw, x.device))
                if self.with_cp and self.training and x.requires_grad:
                    x = cp.checkpoint(blk, x, hw, geometry, use_reentrant=False)
                else:
                    x = blk(x, hw, geometry)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(x)
                outs.append(tokens_to_contiguous_map(out, hw))
            if layer.downsample is not None:
                # the map as a channels-last view of the tokens: the conv's last-bit rounding
                # depends on the input layout, so this is kept as it was
                x = x.view(x.shape[0], hw[0], hw[1], -1).permute(0, 3, 1, 2)
                x, hw = layer.downsample(x)
        return tuple(outs)
