"""Attention-residual (AR) downsampling of LaViT (Zhang et al., CVPR 2024, sec. 3.3, Eq. 6-7)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from ... import ops
from ...ops.query_grid_conv import tail_padding
from ...registry import register_model
from ...utils.geometry_cache import GeometryCache
from .less_attention import FactoredScores


def fit_key_grid(attn, k_hw, out_k_hw):
    """Crop or zero-pad the key grid of ``attn (B, H, Nq, Hk*Wk)`` to ``out_k_hw``.

    Two stages' key grids can differ by one cell on odd inputs (each stage's reduction conv
    drops its own remainder); a zero residual on the missing cell is the neutral choice.
    """
    k_hw, out_k_hw = tuple(k_hw), tuple(out_k_hw)
    if k_hw == out_k_hw:
        return attn
    b, h, nq, _ = attn.shape
    grid = attn.reshape(b, h, nq, *k_hw)[..., :out_k_hw[0], :out_k_hw[1]]
    grid = F.pad(grid, (0, out_k_hw[1] - grid.shape[-1], 0, out_k_hw[0] - grid.shape[-2]))
    return grid.reshape(b, h, nq, out_k_hw[0] * out_k_hw[1])


@register_model
class AttentionResidualDownsample(BaseModule):
    """Carries the last attention map of stage ``s`` into the first layer of stage ``s+1``.

    Sec. 3.3 (Eq. 6): ``Ã = LS(Conv1x1(DWConv(A_last)))``, added to the pre-softmax scores of
    the next stage's first (vanilla) attention layer. The map is treated as an image whose
    channels are the heads: for each key, the attention column over the *query grid* is a
    ``Hq×Wq`` image, downsampled by a depthwise ``k=s=2`` conv (the 2×2 token merge of the
    next patch embedding; not a stride over the flattened ``N×N`` matrix, which would merge
    raster strips). The 1×1 conv then exchanges information across heads
    (``in_heads → out_heads``) and LayerScale (CaiT) scales each output head by a learnable
    ``γ`` initialised small, so the residual starts almost neutral.

    The three linear maps are applied as one: ``W[o, h, i, j] = γ_o·pw[o, h]·dw[h, i, j]`` and
    bias ``γ_o·(pw[o]·b_dw + b_pw[o])``, summed over strided slices of the scores' query grid
    (:func:`mmeffvit.ops.query_grid_conv`); the parameters keep the conv names and shapes
    (checkpoints load).

    With PVT spatial reduction the key grid is the same in every stage (``H/32×W/32``), so by
    default only queries are downsampled; ``key_stride > 1`` also average-pools the key grid
    (for backbones without spatial reduction). No weight depends on the token count, so the
    module runs at any resolution; odd query grids are zero-padded (bottom/right), matching
    the ``ceil`` token grid of a padding patch embedding.

    Args:
        in_heads (int): Heads of stage ``s`` (input channels).
        out_heads (int): Heads of stage ``s+1``.
        kernel_size (int): Depthwise kernel on the query grid.
        stride (int): Its stride (2 for a 2×2 patch merge).
        key_stride (int): Average-pooling factor of the key grid (1 = keep).
        layer_scale_init (float | None): Initial ``γ``; None disables LayerScale.
        init_cfg (dict, optional): Initialisation config.

    Example:
        >>> import torch
        >>> ar = AttentionResidualDownsample(2, 5)
        >>> attn = torch.randn(1, 2, 28 * 28, 49)
        >>> ar(attn, (28, 28), (7, 7)).shape
        torch.Size([1, 5, 196, 49])
    """

    def __init__(self, in_heads, out_heads, kernel_size=2, stride=2, key_stride=1,
                 layer_scale_init=1e-4, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if min(in_heads, out_heads, kernel_size, stride, key_stride) < 1:
            raise ValueError('heads, kernel_size, stride and key_stride must be positive')
        if kernel_size < stride:
            raise ValueError(f'kernel_size {kernel_size} < stride {stride} would skip tokens')
        self.in_heads, self.out_heads = in_heads, out_heads
        self.stride, self.key_stride = stride, key_stride
        self.dwconv = nn.Conv2d(in_heads, in_heads, kernel_size, stride=stride, groups=in_heads)
        self.pwconv = nn.Conv2d(in_heads, out_heads, 1)
        self.gamma = (nn.Parameter(torch.full((out_heads, ), float(layer_scale_init)))
                      if layer_scale_init is not None else None)
        self._window_cache = GeometryCache(maxsize=16)  # run-time, not state

    def out_grid(self, q_hw):
        """Query grid after downsampling (``ceil``, as the padding patch embedding)."""
        return tuple(-(-s // self.stride) for s in q_hw)

    def folded(self):
        """``(W (out, in, k, k), bias (out,))`` of ``γ·pwconv(dwconv(·))``."""
        pw = self.pwconv.weight[:, :, 0, 0]
        weight = pw[:, :, None, None] * self.dwconv.weight[:, 0][None]
        bias = pw @ self.dwconv.bias + self.pwconv.bias
        if self.gamma is not None:
            weight = weight * self.gamma.view(-1, 1, 1, 1)
            bias = bias * self.gamma
        return weight, bias

    def _check(self, attn, q_hw, k_hw):
        _, h, nq, nk = attn.shape
        if h != self.in_heads or nq != q_hw[0] * q_hw[1] or nk != k_hw[0] * k_hw[1]:
            raise ValueError(f'attention {tuple(attn.shape)} does not match in_heads='
                             f'{self.in_heads}, q_hw={tuple(q_hw)}, k_hw={tuple(k_hw)}')

    def _conv(self, attn, q_hw, out_hw, weight, bias=None):
        """``(B, in, Hq*Wq, Nk)`` → ``(B, out, Hq'*Wq', Nk)``, plus ``bias (out, )`` if given."""
        b, h, _, nk = attn.shape
        grid = attn.reshape(b, h, *q_hw, nk)
        weight = weight.to(attn.dtype)  # the scores' dtype, as a conv under autocast
        bias = None if bias is None else bias.to(attn.dtype)
        if torch.jit.is_tracing():  # what a MAC counter sees: the official dwconv → pwconv
            out = self._unfolded_conv(grid, out_hw)
            if bias is not None:
                out = out + bias.view(1, -1, 1, 1, 1)
        else:
            out = ops.query_grid_conv(grid, weight, bias, self.stride, tuple(out_hw))
        return out.reshape(b, self.out_heads, out_hw[0] * out_hw[1], nk)

    def _unfolded_conv(self, grid, out_hw):
        """:meth:`_conv` as the official two convs (depthwise k×k, then 1×1; keys as batch),
        without bias: counted, the folded ``(out, in, k, k)`` kernel would charge
        ``out·in·k²`` multiply-adds per output instead of the model's ``in·k² + out·in``."""
        b, h, hq, wq, nk = grid.shape
        maps = grid.permute(0, 4, 1, 2, 3).reshape(b * nk, h, hq, wq)
        pad_h, pad_w = tail_padding((hq, wq), out_hw, self.dwconv.kernel_size[0], self.stride)
        maps = F.pad(maps, (0, pad_w, 0, pad_h))
        x = F.conv2d(maps, self.dwconv.weight.to(maps.dtype), stride=self.stride, groups=h)
        x = x[..., :out_hw[0], :out_hw[1]]
        pointwise = self.pwconv.weight
        if self.gamma is not None:
            pointwise = pointwise * self.gamma.view(-1, 1, 1, 1)
        x = F.conv2d(x, pointwise.to(x.dtype))
        return x.reshape(b, nk, self.out_heads, *out_hw).permute(0, 2, 3, 4, 1)

    def forward(self, attn, q_hw, k_hw, out_k_hw=None):
        """Args:
            attn (Tensor | FactoredScores): ``(B, in_heads, Hq*Wq, Hk*Wk)`` scores of stage
                ``s``; factored scores give a factored residual (``key_stride == 1``).
            q_hw, k_hw (tuple[int]): Query and key grids.
            out_k_hw (tuple[int], optional): Key grid of stage ``s+1`` (crop/zero-pad to it).

        Returns:
            Tensor | FactoredScores: ``(B, out_heads, Hq'*Wq', Hk'*Wk')`` residual scores.
        """
        if isinstance(attn, FactoredScores):
            if self.key_stride == 1 and not torch.jit.is_tracing():
                return self._forward_factors(attn, q_hw, k_hw, out_k_hw)
            attn = attn.dense()
        self._check(attn, q_hw, k_hw)
        weight, bias = self.folded()
        oq = self.out_grid(q_hw)
        x = self._conv(attn, q_hw, oq, weight, bias)
        if self.key_stride > 1:
            b, s = x.shape[0], self.key_stride
            grid = x.reshape(b * self.out_heads, oq[0] * oq[1], *k_hw)
            grid = F.avg_pool2d(grid, s, s, ceil_mode=True)
            k_hw = tuple(grid.shape[-2:])
            x = grid.reshape(b, self.out_heads, oq[0] * oq[1], k_hw[0] * k_hw[1])
        if out_k_hw is not None:
            x = fit_key_grid(x, k_hw, out_k_hw)
        return x

    def _forward_factors(self, scores, q_hw, k_hw, out_k_hw):
        """:meth:`forward` of :class:`FactoredScores`, as factors: the convs act on the query
        grid only, so ``AR(Q Kᵀ) = conv(Q) Kᵀ`` per input head, the heads' products summed by
        concatenating their features; the bias is a feature column (one on the query side, the
        bias on the key side, zero on keys ``fit_key_grid`` pads). ``key_stride == 1``."""
        query, key = scores.query, scores.key
        b, h, nq, f = query.shape
        self._check_factors(scores, q_hw, k_hw)
        weight, bias = self.folded()
        weight, bias = weight.to(query.dtype), bias.to(query.dtype)
        oq = self.out_grid(q_hw)
        grid = query.reshape(b, h, *q_hw, f)
        parts = [ops.query_grid_conv(grid[:, c:c + 1], weight[:, c:c + 1], None, self.stride, oq)
                 for c in range(h)]
        conv_query = torch.cat(parts, -1).reshape(b, self.out_heads, oq[0] * oq[1], h * f)
        out_k_hw = tuple(k_hw) if out_k_hw is None else tuple(out_k_hw)
        keys = key.expand(b, h, -1, -1).permute(0, 2, 1, 3).reshape(b, 1, -1, h * f)
        # the map path's crop / zero-pad of the key grid, on the key axis of the factor
        keys = fit_key_grid(keys.transpose(-2, -1), k_hw, out_k_hw).transpose(-2, -1)
        padded = out_k_hw[0] > k_hw[0] or out_k_hw[1] > k_hw[1]
        bias_key = bias.view(1, -1, 1, 1).expand(b, -1, keys.shape[2], 1)
        if padded:  # the padded key cells get no bias either
            valid = fit_key_grid(query.new_ones(1, 1, 1, k_hw[0] * k_hw[1]), k_hw, out_k_hw)
            bias_key = bias_key * valid.view(1, 1, -1, 1)
        conv_query = torch.cat([conv_query, conv_query.new_ones(1, 1, 1, 1).expand(
            b, self.out_heads, conv_query.shape[2], 1)], -1)
        keys = torch.cat([keys.expand(b, self.out_heads, -1, -1), bias_key], -1)
        return FactoredScores(conv_query, keys, invariant_tail=0 if padded else 1)

    def _check_factors(self, scores, q_hw, k_hw):
        query, key = scores.query, scores.key
        if (query.shape[1] != self.in_heads or key.shape[1] not in (1, self.in_heads)
                or query.shape[2] != q_hw[0] * q_hw[1] or key.shape[2] != k_hw[0] * k_hw[1]
                or query.shape[-1] != key.shape[-1]):
            raise ValueError(f'factored scores {tuple(query.shape)} x {tuple(key.shape)} do not '
                             f'match in_heads={self.in_heads}, q_hw={tuple(q_hw)}, '
                             f'k_hw={tuple(k_hw)}')

    def _window_geometry(self, q_hw, k_hw, n_win, q_win, k_win, device):
        """Per shape (cached; integer logic only): flat indices of each window's input block in
        the map, the mask of those that exist, the mask of the residual entries the global
        module would produce (the others are zero there: padding, no bias), and the same blocks
        as query rows × key columns (``factors``) for :class:`FactoredScores`."""
        key = (tuple(q_hw), tuple(k_hw), tuple(n_win), tuple(q_win), tuple(k_win), device)
        return self._window_cache(key, lambda: self._build_window_geometry(
            q_hw, k_hw, n_win, q_win, k_win, device))

    def _build_window_geometry(self, q_hw, k_hw, n_win, q_win, k_win, device):
        s, ks, kernel = self.stride, self.key_stride, self.dwconv.kernel_size[0]
        (nh, nw), (qh, qw), (kh, kw) = n_win, q_win, k_win
        in_q = ((qh - 1) * s + kernel, (qw - 1) * s + kernel)
        in_k = (kh * ks, kw * ks)
        out_q, out_k = self.out_grid(q_hw), tuple(-(-k // ks) for k in k_hw)

        def axis(n, step, size, dim):
            """Positions ``window·step + offset`` as a 7-d tensor (windows a, b, heads, query
            rows, query cols, key rows, key cols); rows sit on window axis a, cols on b."""
            pos = (torch.arange(n, device=device)[:, None] * step
                   + torch.arange(size, device=device))
            shape = [1] * 7
            shape[(dim + 1) % 2], shape[dim] = n, size
            return pos.view(shape)

        qr, qc = axis(nh, qh * s, in_q[0], 3), axis(nw, qw * s, in_q[1], 4)
        kr, kc = axis(nh, kh * ks, in_k[0], 5), axis(nw, kw * ks, in_k[1], 6)
        # query cells and key cells of each window (flat in their grids), which exist
        rows, cols = qr * q_hw[1] + qc, kr * k_hw[1] + kc
        row_valid, col_valid = (qr < q_hw[0]) & (qc < q_hw[1]), (kr < k_hw[0]) & (kc < k_hw[1])
        rows_inside = ((nh - 1) * qh * s + in_q[0] <= q_hw[0]
                       and (nw - 1) * qw * s + in_q[1] <= q_hw[1])
        cols_inside = nh * in_k[0] <= k_hw[0] and nw * in_k[1] <= k_hw[1]
        heads = torch.arange(self.in_heads, device=device).view(1, 1, -1, 1, 1, 1, 1)
        index = (heads * (q_hw[0] * q_hw[1]) + rows) * (k_hw[0] * k_hw[1]) + cols
        in_valid = None
        if not (rows_inside and cols_inside):
            in_valid = (row_valid & col_valid).expand(index.shape)
            index = torch.where(in_valid, index, torch.zeros_like(index))
            in_valid = in_valid.reshape(nh * nw, self.in_heads, in_q[0], in_q[1], -1)
        out_valid = None
        if nh * qh > out_q[0] or nw * qw > out_q[1] or nh * kh > out_k[0] or nw * kw > out_k[1]:
            out_valid = ((axis(nh, qh, qh, 3) < out_q[0]) & (axis(nw, qw, qw, 4) < out_q[1])
                         & (axis(nh, kh, kh, 5) < out_k[0]) & (axis(nw, kw, kw, 6) < out_k[1]))
            out_valid = out_valid.reshape(nh * nw, 1, qh * qw, kh * kw)
        count = None
        if ks > 1:  # in-bounds fine key cells per pooled cell: avg_pool2d's ceil_mode divisor
            fine = col_valid.to(torch.get_default_dtype())
            count = fine.reshape(nh * nw, 1, kh, ks, kw, ks).sum((3, 5)).clamp(min=1)
            count = count.reshape(nh * nw, 1, 1, kh * kw)
        # the same blocks as query rows x key columns, for factored scores
        rows = torch.where(row_valid, rows, torch.zeros_like(rows)).reshape(nh * nw, -1)
        cols = torch.where(col_valid, cols, torch.zeros_like(cols)).reshape(nh * nw, -1)
        factors = dict(rows=rows.reshape(-1), cols=cols.reshape(-1),
                       row_valid=None if rows_inside else row_valid.reshape(nh * nw, -1),
                       col_valid=None if cols_inside else col_valid.reshape(nh * nw, -1))
        return dict(index=index.reshape(-1), in_valid=in_valid, in_q=in_q, in_k=in_k,
                    out_valid=out_valid, count=count, factors=factors)

    @staticmethod
    def _factored_blocks(scores, factors, n):
        """The window-diagonal blocks of factored scores, ``(B*nW, H, Lq, Lk)``, made from the
        windows' query and key rows (cells beyond the grids zeroed): linear in the pixels."""
        query, key = scores.query, scores.key
        b, h, _, f = query.shape

        def rows(x, index, valid):
            x = x.index_select(2, index).view(b, x.shape[1], n, -1, f)
            return x if valid is None else x * valid.to(x.dtype).view(1, 1, n, -1, 1)

        blocks = rows(query, factors['rows'], factors['row_valid']) @ rows(
            key, factors['cols'], factors['col_valid']).transpose(-2, -1)
        return blocks.transpose(1, 2).reshape(b * n, h, blocks.shape[-2], blocks.shape[-1])

    def forward_windows(self, attn, q_hw, k_hw, n_win, q_win, k_win):
        """The residual of each window of the next stage from the same window of this map.

        Equals the global residual (:meth:`forward`) cut into the ``n_win`` windows of
        ``q_win`` queries × ``k_win`` keys of the next stage (query grid zero-padded, key grid
        cropped/zero-padded to whole windows), but only the window-diagonal blocks of ``attn``
        are read: linear instead of quadratic in the pixels.

        Args:
            attn (Tensor | FactoredScores): ``(B, in_heads, Hq*Wq, Hk*Wk)`` scores of stage
                ``s`` (global), or their factors (then only the blocks are multiplied out).
            q_hw, k_hw (tuple[int]): Its query and key grids.
            n_win (tuple[int]): Windows of stage ``s+1`` (rows, cols).
            q_win, k_win (tuple[int]): Query / key cells of one window of stage ``s+1``.

        Returns:
            Tensor: ``(B*nW, out_heads, qh*qw, kh*kw)``, windows in raster order per image.
        """
        n = n_win[0] * n_win[1]
        if isinstance(attn, FactoredScores):
            self._check_factors(attn, q_hw, k_hw)
            b, h = attn.query.shape[:2]
            geo = self._window_geometry(q_hw, k_hw, n_win, q_win, k_win, attn.query.device)
            blocks = self._factored_blocks(attn, geo['factors'], n)
        else:
            self._check(attn, q_hw, k_hw)
            b, h = attn.shape[:2]
            geo = self._window_geometry(q_hw, k_hw, n_win, q_win, k_win, attn.device)
            blocks = attn.reshape(b, -1).index_select(1, geo['index'])
            blocks = blocks.view(b * n, h, *geo['in_q'], -1)
            if geo['in_valid'] is not None:
                blocks = blocks * geo['in_valid'].repeat(b, 1, 1, 1, 1)
        weight, bias = self.folded()
        blocks = blocks.reshape(b * n, h, -1, blocks.shape[-1])
        if self.key_stride == 1 and geo['out_valid'] is None:  # every entry gets the bias
            return self._conv(blocks, geo['in_q'], q_win, weight, bias)
        x = self._conv(blocks, geo['in_q'], q_win, weight)
        if self.key_stride > 1:
            s, (kh, kw) = self.key_stride, k_win
            x = x.reshape(b * n, self.out_heads, -1, kh, s, kw, s).sum((4, 6))
            x = (x.reshape(b, n, self.out_heads, -1, kh * kw) / geo['count']).flatten(0, 1)
        bias = bias.to(x.dtype).view(1, -1, 1, 1)
        if geo['out_valid'] is None:
            return x + bias
        return (x.view(b, n, *x.shape[1:]) + bias * geo['out_valid']).flatten(0, 1)
