"""The attention maps of each family, recomputed in float64 from a module's recorded inputs.

One function per attention module class (matched by class name, see :data:`HANDLERS`); each
reads the module's parameters by their official names and the arguments its ``forward`` got,
and returns the dense maps of :class:`~mmeffvit.analysis.attention_maps.MapKind`. The formulas
are the papers'; where a detail of mmeffvit's implementation matters (padding, masks, the
normaliser's epsilon) it is named next to the code.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..models.layers.less_attention import FactoredScores
from ..utils.tensor import resize_token_grid


@dataclass
class MapKind:
    """One kind of attention map of a block.

    Attributes:
        name (str): Short identifier (``'linear'``, ``'softmax'``, ``'va'`` ...).
        title (str): What the map is, for picture titles and tables.
        matrix (Tensor): ``(heads, N, n)`` float64; row ``i`` is query ``i``'s weights over the
            ``n`` cells of :attr:`key_grid` (row-major).
        key_grid (tuple[int, int]): Rows and columns of key cells.
        key_cell (tuple[float, float]): Size of one key cell in stage tokens.
        key_origin (tuple[float, float]): Position of cell (0, 0)'s top-left corner in stage
            tokens (negative when a pooled grid starts outside the map).
        signed (bool): Entries may be negative (convolution terms).
        stochastic (bool): Rows are probability distributions (sum to one).
        draw (bool): Drawn as a panel (else only in the rank table).
    """
    name: str
    title: str
    matrix: torch.Tensor
    key_grid: tuple
    key_cell: tuple = (1.0, 1.0)
    key_origin: tuple = (0.0, 0.0)
    signed: bool = False
    stochastic: bool = True
    draw: bool = True


@dataclass
class BlockMaps:
    """The maps of one block: ``query_grid`` is the stage's ``(H, W)`` token grid."""
    stage: int
    block: int
    attention: str
    query_grid: tuple
    num_heads: int
    head_dims: int
    kinds: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def kind(self, name):
        for kind in self.kinds:
            if kind.name == name:
                return kind
        raise KeyError(f'no map {name!r}; this block has {[k.name for k in self.kinds]}')


#: FLatten's ``relu(x) + 1e-6`` in the kernel and ``+ 1e-6`` in the normaliser (official code)
FLATTEN_EPS = 1e-6


# -- float64 replays of the modules' own layers (weights detached: maps carry no graph) ----------
def _param(t):
    return None if t is None else t.detach().cpu().double()


def _linear(layer, x):
    return F.linear(x, _param(layer.weight), _param(layer.bias))


def _layer_norm(layer, x):
    return F.layer_norm(x, layer.normalized_shape, _param(layer.weight), _param(layer.bias),
                        layer.eps)


def _reduce(attn, x, hw):
    """PVT's key/value source: tokens ``(B, H*W, C)`` through ``attn.sr`` + ``attn.norm``."""
    sr = getattr(attn, 'sr', None)
    if sr is None:
        return x, tuple(hw), (1, 1)
    b, _, c = x.shape
    grid = x.transpose(1, 2).reshape(b, c, *hw)
    grid = F.conv2d(grid, _param(sr.weight), _param(sr.bias), stride=sr.stride,
                    padding=sr.padding)
    kv_hw = tuple(grid.shape[-2:])
    return _layer_norm(attn.norm, grid.flatten(2).transpose(1, 2)), kv_hw, tuple(sr.stride)


def _heads(t, num_heads):
    """``(..., N, C)`` -> ``(..., h, N, d)``; channel ``c`` belongs to head ``c // d``."""
    return t.reshape(*t.shape[:-1], num_heads, -1).transpose(-3, -2)


def _softmax(scores, additive_mask=None):
    if additive_mask is not None:
        scores = scores + additive_mask
    return scores.softmax(-1)


def _grid_value(args):
    """The first ``(H, W)`` pair among a ``forward``'s arguments."""
    for value in args.values():
        if isinstance(value, (tuple, list)) and len(value) == 2 and all(
                isinstance(s, int) for s in value):
            return tuple(value)
    raise RuntimeError(f'no (H, W) argument among {list(args)}')


# -- geometry helpers -----------------------------------------------------------------------------
def local_kernel_matrix(kernel, grid):
    """``(N, N)`` matrix of a 2-D cross-correlation with ``kernel`` ``(K, K)`` on a zero-padded
    ``grid``: entry ``(i, j)`` is the weight the conv gives input cell ``j`` at output cell ``i``
    (``kernel[yj - yi + K//2, xj - xi + K//2]``, zero beyond the kernel)."""
    kh, kw = kernel.shape[-2:]
    rows, cols = grid
    ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing='ij')
    ys, xs = ys.flatten(), xs.flatten()
    dy = ys[None, :] - ys[:, None] + kh // 2
    dx = xs[None, :] - xs[:, None] + kw // 2
    inside = (dy >= 0) & (dy < kh) & (dx >= 0) & (dx < kw)
    values = kernel[..., dy.clamp(0, kh - 1), dx.clamp(0, kw - 1)]
    return values * inside.to(values.dtype)


def scatter_windows(win_maps, n_win, win_q, win_k):
    """Window-local maps ``(nW, h, Nq_w, Nk_w)`` (windows row-major over ``n_win``, tokens
    row-major inside) -> ``(h, Hq*Wq, Hk*Wk)`` on the padded query and key grids."""
    nw, h, nq, nk = win_maps.shape
    (gh, gw), (qh, qw), (kh, kw) = n_win, win_q, win_k
    if nw != gh * gw or nq != qh * qw or nk != kh * kw:
        raise RuntimeError(f'{nw} windows of {nq}x{nk} do not match {n_win} windows of '
                           f'{win_q} queries and {win_k} keys')
    a, b = torch.arange(nw) // gw, torch.arange(nw) % gw
    qidx = ((a * qh)[:, None] + torch.arange(nq) // qw) * (gw * qw) + (
        (b * qw)[:, None] + torch.arange(nq) % qw)
    kidx = ((a * kh)[:, None] + torch.arange(nk) // kw) * (gw * kw) + (
        (b * kw)[:, None] + torch.arange(nk) % kw)
    out = win_maps.new_zeros(h, gh * qh * gw * qw, gh * kh * gw * kw)
    out[:, qidx[:, :, None], kidx[:, None, :]] = win_maps.permute(1, 0, 2, 3)
    return out


def real_rows(padded_grid, grid):
    """Row-major indices of the cells of ``grid`` inside the larger ``padded_grid``."""
    ys, xs = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing='ij')
    return (ys * padded_grid[1] + xs).flatten()


def _ceil_windows(grid, window):
    return (-(-grid[0] // window[0]), -(-grid[1] // window[1]))


# -- FLatten (focused linear attention), PVT's SRA ------------------------------------------------
def focused_kernel(x, raw_scale, power):
    """φ_p of FLatten (sec. 4.1, eq. 5-6): ``t = (relu(x) + ε) / softplus(s)``, then
    ``‖t‖·t^p/‖t^p‖`` with the norms over all channels of a token."""
    t = (F.relu(x) + FLATTEN_EPS) / F.softplus(_param(raw_scale).reshape(-1))
    tp = t ** power
    return tp * (t.norm(dim=-1, keepdim=True) / tp.norm(dim=-1, keepdim=True))


def flatten_maps(attn, args, grid, block=None):
    """FLatten's implicit map, its local (DWC, LePE) term and a softmax reference.

    **Linear**: ``A_h[i, j] = (φ(q_i)·φ(k_j) / n) / (φ(q_i)·mean_j φ(k_j) + ε)`` per head h,
    with the positional encoding added to k first: the matrix that multiplies V in
    ``O = A V + DWC(V)`` (the mean-normalised form of the official code). Rows sum to
    ``m_i / (m_i + ε)`` with ``m_i = φ(q_i)·mean_j φ(k_j)``: one, except where a head's focused
    features nearly vanish (the focusing norms run over all heads' channels together).

    **Local term** (sec. 4.2, eq. 9-10 write it as a sparse matrix ``M_D`` added to the attention
    matrix). The DWC is a K×K depthwise conv of V with one kernel ``w_c`` per channel c (shared by
    all heads), so ``M_D`` differs per channel. What is drawn is the map the output would have if
    V were one-hot per key: with ``v_j = 1`` in every channel for one key j and 0 elsewhere,
    query i's output averaged over a head's d channels is ``w̄[y_j - y_i + K//2, x_j - x_i + K//2]``
    (the channel-mean kernel at the offset from i to j; zero beyond the kernel and for taps
    outside the map, the conv's zero padding). That is entry (i, j) of ``M̄``; the conv's bias
    does not depend on V and is left out. ``A + M̄`` is then the whole token mixing for such a V,
    and per channel c the exact matrix is ``A + M_c``. With spatial reduction the DWC runs on the
    key grid and is resized bilinearly to the queries, so ``M̄`` is the bilinear upsampling of
    the key-grid matrix. CSWin's LePE (a 3×3 depthwise conv on v, per channel of every head) is
    added the same way, with the mean over each head's own channels.

    **Softmax reference**: ``softmax(q_i·k_j / √d)`` of the same projected q and k (PE included).
    """
    h = attn.num_heads
    if 'x' in args:
        x = args['x'][0].double()
        hw = _grid_value(args)
        if hasattr(attn, 'qkv'):
            q, k, v = _linear(attn.qkv, x).chunk(3, -1)
            kv_hw, cell = hw, (1, 1)
        else:
            q = _linear(attn.q, x)
            src, kv_hw, cell = _reduce(attn, x[None], hw)
            k, v = _linear(attn.kv, src[0]).chunk(2, -1)
    else:  # a wrapper that projects itself and passes q, k, v (CSWin's LePE variant)
        q, k, v = (args[name][0].double() for name in ('q', 'k', 'v'))
        hw = _grid_value(args)
        kv_hw, cell = hw, (1, 1)
    if attn.positional_encoding is not None:
        pe = _param(attn.positional_encoding)
        k = k + resize_token_grid(pe, attn.pe_size, kv_hw, attn.pe_interpolation)[0]
    n = kv_hw[0] * kv_hw[1]
    power = attn.focusing_factor
    qf = _heads(focused_kernel(q, attn.scale, power), h)
    kf = _heads(focused_kernel(k, attn.scale, power), h)
    z = 1.0 / (qf @ kf.mean(1)[..., None] + FLATTEN_EPS)
    linear = (qf @ kf.transpose(1, 2)) / n * z

    dwc = attn.dwc
    if dwc.padding[0] != dwc.kernel_size[0] // 2 or dwc.stride != (1, 1):
        raise RuntimeError(f'the DWC {dwc} does not keep the grid size')
    local = local_kernel_matrix(_param(dwc.weight)[:, 0].mean(0), kv_hw)
    if kv_hw != tuple(hw):
        cols = local.t().reshape(n, 1, *kv_hw)
        cols = F.interpolate(cols, size=tuple(hw), mode='bilinear', align_corners=False)
        local = cols.reshape(n, -1).t()
    local = local.expand(h, -1, -1)
    k_size = dwc.kernel_size[0]
    local_title = f'DWC {k_size}x{k_size} on V (channel-mean kernel)'
    if hasattr(attn, 'get_v'):  # CSWin: LePE on v, per channel of every head
        lepe = _param(attn.get_v.weight)[:, 0].reshape(h, -1, *attn.get_v.kernel_size)
        local = local + local_kernel_matrix(lepe.mean(1), hw)
        local_title = (f'DWC {k_size}x{k_size} + LePE {attn.get_v.kernel_size[0]}x'
                       f'{attn.get_v.kernel_size[0]} on V (channel-mean kernels)')
    d = q.shape[-1] // h
    softmax = _softmax((_heads(q, h) * d ** -0.5) @ _heads(k, h).transpose(1, 2))
    geometry = dict(key_grid=kv_hw, key_cell=tuple(float(c) for c in cell))
    kinds = [
        MapKind('linear', 'linear φ(q)·φ(k)ᵀ, normalised', linear, stochastic=False,
                **geometry),
        MapKind('local', local_title, local, signed=True, stochastic=False, **geometry),
        MapKind('linear+local', 'linear + local: all that multiplies V', linear + local,
                signed=True, stochastic=False, **geometry),
        MapKind('softmax', 'softmax(q·kᵀ/√d) of the same q, k', softmax, **geometry),
    ]
    notes = [f'focusing power p={power}; keys on a {kv_hw[0]}x{kv_hw[1]} grid']
    return dict(attention='focused linear attention (FLatten)', num_heads=h, head_dims=d,
                kinds=kinds, notes=notes)


def sra_maps(attn, args, grid, block=None):
    """PVT's spatial-reduction softmax attention ('S' blocks of FLatten-PVT)."""
    h = attn.num_heads
    x = args['x'].double()
    hw = _grid_value(args)
    q = _heads(_linear(attn.q, x), h)[0]
    src, kv_hw, cell = _reduce(attn, x, hw)
    k = _heads(_linear(attn.kv, src).chunk(2, -1)[0], h)[0]
    d = q.shape[-1]
    probs = _softmax((q * d ** -0.5) @ k.transpose(-2, -1))
    kind = MapKind('softmax', 'softmax over spatially reduced keys (PVT SRA)', probs, kv_hw,
                   tuple(float(c) for c in cell))
    return dict(attention='spatial-reduction attention (PVT)', num_heads=h, head_dims=d,
                kinds=[kind], notes=[])


# -- LaViT ----------------------------------------------------------------------------------------
def _lavit_windows(x, window, grid):
    """Number of windows of the stage grid and a check that the batch holds them (B = 1)."""
    n_win = _ceil_windows(grid, window)
    if x.shape[0] != n_win[0] * n_win[1]:
        raise RuntimeError(f'{x.shape[0]} windows recorded, the {grid} grid has {n_win}')
    return n_win


def _lavit_geometry(win_maps, window, k_window, grid):
    n_win = _ceil_windows(grid, window)
    full = scatter_windows(win_maps, n_win, window, k_window)
    padded = (n_win[0] * window[0], n_win[1] * window[1])
    full = full[:, real_rows(padded, grid)]
    key_grid = (n_win[0] * k_window[0], n_win[1] * k_window[1])
    cell = (window[0] / k_window[0], window[1] / k_window[1])
    return full, dict(key_grid=key_grid, key_cell=cell)


def lavit_va_maps(attn, args, grid, block=None):
    """LaViT's vanilla attention (sec. 3.2, Eq. 4): ``softmax(QKᵀ/√d + R)`` with the AR residual
    R of the previous stage (sec. 3.3) on its first layer; per window in ``la_mode='window'``,
    padded keys masked."""
    h = attn.num_heads
    x = args['x'].double()
    window = _grid_value(args)
    _lavit_windows(x, window, grid)
    q = _heads(_linear(attn.q, x), h)
    src, k_window, _ = _reduce(attn, x, window)
    k = _heads(_linear(attn.kv, src).chunk(2, -1)[0], h)
    d = q.shape[-1]
    scores = (q * d ** -0.5) @ k.transpose(-2, -1)
    residual = args.get('residual')
    if isinstance(residual, FactoredScores):  # carried as factors between global stages
        residual = residual.dense()
    if residual is not None:
        scores = scores + residual.double()
    mask = _key_mask(args.get('key_mask'))
    full, geometry = _lavit_geometry(_softmax(scores, mask), window, k_window, grid)
    title = 'VA softmax(QKᵀ/√d' + (' + AR residual)' if residual is not None else ')')
    notes = [f'windows of {window[0]}x{window[1]} tokens' if tuple(window) != tuple(grid)
             else 'global (one window = the stage map)']
    return dict(attention='LaViT vanilla attention (VA)', num_heads=h, head_dims=d,
                kinds=[MapKind('va', title, full, **geometry)], notes=notes)


def _key_mask(key_mask):
    """LaViT's boolean key mask (True = padding) as an additive one."""
    if key_mask is None:
        return None
    return torch.zeros(key_mask.shape, dtype=torch.float64).masked_fill(key_mask, -math.inf)


def lavit_la_maps(attn, args, grid, block=None):
    """LaViT's less attention (sec. 3.2, Eq. 5): ``softmax(Ψ(Θ(A^{l-1})ᵀ)ᵀ)``; the map it
    transforms, ``softmax(A^{l-1})``, is given for comparison."""
    h = attn.num_heads
    x = args['x'].double()
    window = _grid_value(args)
    _lavit_windows(x, window, grid)
    prev = args['prev_scores'].double()
    transformed = _linear(attn.psi, _linear(attn.theta, prev).transpose(-2, -1))
    transformed = transformed.transpose(-2, -1)
    mask = _key_mask(args.get('key_mask'))
    _, k_window, _ = _reduce(attn, x[:1], window)
    la, geometry = _lavit_geometry(_softmax(transformed, mask), window, k_window, grid)
    before, _ = _lavit_geometry(_softmax(prev, mask), window, k_window, grid)
    kinds = [MapKind('la', 'LA softmax(Ψ(Θ(A_prev)ᵀ)ᵀ)', la, **geometry),
             MapKind('la_input', 'softmax(A_prev): the map LA transforms', before,
                     **geometry)]
    return dict(attention='LaViT less attention (LA)', num_heads=h,
                head_dims=x.shape[-1] // h, kinds=kinds, notes=[])


# -- Focal Transformer ----------------------------------------------------------------------------
def window_relative_index(window, table_window):
    """Swin's index of (query, key) pairs of a ``window²`` window into a ``(2W-1)²`` table."""
    ys, xs = torch.meshgrid(torch.arange(window), torch.arange(window), indexing='ij')
    ys, xs = ys.flatten(), xs.flatten()
    dy = ys[:, None] - ys[None, :] + table_window - 1
    dx = xs[:, None] - xs[None, :] + table_window - 1
    return dy * (2 * table_window - 1) + dx


def _focal_bias(attn):
    """``(h, w², N)`` relative bias of every key slot: window, surroundings, pooled levels."""
    w, h = attn.window_size, attn.num_heads
    table = _param(attn.relative_position_bias_table)
    parts = [table[window_relative_index(w, w)].permute(2, 0, 1)]
    if attn.expand_size > 0:
        parts.append(_param(attn.relative_position_bias_table_to_neighbors)[0])
    for level, tab in enumerate(attn.relative_position_bias_table_to_windows):
        region = attn.focal_window + 2 ** level - 1
        qy, qx = (t.flatten() for t in torch.meshgrid(torch.arange(w), torch.arange(w),
                                                      indexing='ij'))
        ky, kx = (t.flatten() for t in torch.meshgrid(torch.arange(region),
                                                      torch.arange(region), indexing='ij'))
        index = ((qy[:, None] - ky[None] + region - 1) * (w + region - 1)
                 + qx[:, None] - kx[None] + region - 1)
        parts.append(_param(tab)[:, index.reshape(-1)].reshape(h, w * w, -1))
    return torch.cat(parts, -1)


def _pooled_origin(padded, cells, side):
    """Where pooled cell 0 starts in the padded map: the pooled level centre-crops or
    centre-pads the map to ``cells * side`` tokens (Focal's official ``centre`` fit)."""
    size = cells * side
    return (padded - size) // 2 if padded >= size else -((size - padded) // 2)


def focal_maps(attn, args, grid, block=None):
    """Focal self-attention (Yang et al. 2021, sec. 3.2): one softmax over the window's own
    tokens, its surrounding ring (fine level) and the pooled sub-window tokens around it.

    The key of every slot is read from the gather index the block passes to the module (into
    ``[fine map | pooled level 1 | ... | zero token]``), so positions are exactly those
    attended, wrap-around and masks included. The one softmax is split by level: the fine map
    on the token grid and one map per pooled level on its cells, each holding that level's
    share of the mass (duplicate slots of one key are summed).
    """
    x = args['x'].double()
    pooled = [p.double() for p in args['pooled']]
    index, key_mask = args['index'], args['key_mask'].double()
    _, hp, wp, c = x.shape
    h, w = attn.num_heads, attn.window_size
    d = c // h
    gh, gw = hp // w, wp // w
    q, k, _ = _linear(attn.qkv, x.reshape(-1, c)).chunk(3, -1)
    bank = [k] + [_linear(attn.qkv, p.reshape(-1, c)).chunk(3, -1)[1] for p in pooled]
    sizes = [t.shape[0] for t in bank]
    bank = torch.cat(bank + [k.new_zeros(1, c)])
    index = torch.where(index < 0, index + bank.shape[0], index)
    nw, n_slots = index.shape
    keys = _heads(bank[index.reshape(-1)].reshape(nw, n_slots, c), h)
    queries = q.reshape(gh, w, gw, w, h, d).permute(0, 2, 4, 1, 3, 5).reshape(nw, h, w * w, d)
    scores = (queries * d ** -0.5) @ keys.transpose(-2, -1) + _focal_bias(attn)
    probs = _softmax(scores, key_mask[:, None, None, :])  # (nW, h, w², slots)

    a, b = torch.arange(nw) // gw, torch.arange(nw) % gw
    qidx = ((a * w)[:, None] + torch.arange(w * w) // w) * wp + (
        (b * w)[:, None] + torch.arange(w * w) % w)
    keep = real_rows((hp, wp), grid)
    starts = torch.tensor([0] + sizes).cumsum(0)
    kinds, parts = [], []
    for level in range(len(sizes)):
        lo, hi = int(starts[level]), int(starts[level + 1])
        inside = (index >= lo) & (index < hi)
        column = torch.where(inside, index - lo, torch.full_like(index, hi - lo))  # spare col
        dense = probs.new_zeros(h, hp * wp, hi - lo + 1)
        rows = qidx[:, :, None].expand(nw, w * w, n_slots).reshape(-1)
        cols = column[:, None, :].expand(nw, w * w, n_slots).reshape(-1)
        for head in range(h):
            dense[head].index_put_((rows, cols), probs[:, head].reshape(-1), accumulate=True)
        dense = dense[:, keep, :-1]
        parts.append(dense)
        if level == 0:
            kinds.append(MapKind('fine', 'fine level: window + surroundings', dense, (hp, wp),
                                 stochastic=False))
            continue
        cells = pooled[level - 1].shape[1:3]
        side = w // 2 ** (level - 1)
        origin = (_pooled_origin(hp, cells[0], side), _pooled_origin(wp, cells[1], side))
        kinds.append(MapKind(
            f'pooled{level}', f'pooled level {level}: {side}x{side}-token cells', dense,
            tuple(cells), (float(side), float(side)), tuple(float(o) for o in origin),
            stochastic=False))
    kinds.append(MapKind('all', 'all levels (one softmax)', torch.cat(parts, -1),
                         (1, sum(p.shape[-1] for p in parts)), draw=False))
    notes = [f'window {w}, surroundings {attn.expand_size}, {len(pooled)} pooled level(s)']
    return dict(attention='focal self-attention (Focal Transformer)', num_heads=h,
                head_dims=d, kinds=kinds, notes=notes)


# -- L²ViT ----------------------------------------------------------------------------------------
def l2vit_window_maps(attn, args, grid, block=None):
    """L²ViT's local window attention (LWA, sec. 3.1): softmax inside non-overlapping windows,
    no position bias; the zero tokens padding the map to whole windows are ordinary keys (not
    masked, as released), so some mass can fall outside the picture."""
    x = args['x'].double()
    h = attn.num_heads
    side = math.isqrt(x.shape[1])
    window = (side, side)
    q, k, _ = (_heads(t, h) for t in _linear(attn.qkv, x).chunk(3, -1))
    d = q.shape[-1]
    probs = _softmax((q * d ** -0.5) @ k.transpose(-2, -1))
    n_win = _ceil_windows(grid, window)
    full = scatter_windows(probs, n_win, window, window)
    padded = (n_win[0] * side, n_win[1] * side)
    kind = MapKind('window', f'LWA softmax in {side}x{side} windows', full[:, real_rows(
        padded, grid)], padded)
    return dict(attention='L²ViT local window attention (LWA)', num_heads=h, head_dims=d,
                kinds=[kind], notes=[])


def l2vit_global_maps(attn, args, grid, block=None):
    """L²ViT's linear global attention (LGA, sec. 3.2): ``A_h[i, j] = τ_h ReLU(q_i)·ReLU(k_j) /
    max(ReLU(q_i)·Σ_j ReLU(k_j), m)``. Rows sum to ``τ_h·min(1, mass_i / m)``, not to one: the
    clamp ``m`` (100) divides rows of little mass by ``m`` instead of normalising them. A softmax
    of the same q, k is given as reference."""
    x = args['x'][0].double()
    h = attn.num_heads
    q, k, _ = (_heads(t, h) for t in _linear(attn.qkv, x).chunk(3, -1))
    qr, kr = F.relu(q), F.relu(k)
    mass = qr @ kr.sum(1)[..., None]
    tau = _param(attn.temperature).reshape(h, 1, 1)
    linear = tau * (qr @ kr.transpose(1, 2)) / mass.clamp(min=float(attn.min_denominator))
    d = q.shape[-1]
    softmax = _softmax((q * d ** -0.5) @ k.transpose(1, 2))
    clamped = float((mass < attn.min_denominator).double().mean())
    kinds = [MapKind('global', f'LGA linear, τ·ReLU(q)·ReLU(k)ᵀ / max(mass, '
                     f'{attn.min_denominator:g})', linear, tuple(grid), stochastic=False),
             MapKind('softmax', 'softmax(q·kᵀ/√d), same q, k (reference)', softmax,
                     tuple(grid))]
    notes = [f'{clamped:.0%} of the rows have mass below the clamp {attn.min_denominator:g}']
    return dict(attention='L²ViT linear global attention (LGA)', num_heads=h, head_dims=d,
                kinds=kinds, notes=notes)


# -- FLatten-Swin softmax stages, CSWin stripes ---------------------------------------------------
def _block_shift(block, grid):
    if hasattr(block, 'window_and_shift'):
        return int(block.window_and_shift(grid)[1])
    return int(block.shift_size)


def swin_window_maps(attn, args, grid, block=None):
    """Swin's window attention ('S' stages of FLatten-Swin): softmax with the relative position
    bias inside windows of the padded map, cyclically shifted (odd blocks) with the shift mask;
    drawn back at the tokens' unshifted positions. The shared ``WindowMSA`` without a bias table
    is L²ViT's LWA, drawn by :func:`l2vit_window_maps`."""
    if attn.window_size is None:
        return l2vit_window_maps(attn, args, grid, block)
    x = args['x'].double()
    window = int(args['window'])
    mask = args.get('mask')
    h = attn.num_heads
    q, k, _ = (_heads(t, h) for t in _linear(attn.qkv, x).chunk(3, -1))
    d = q.shape[-1]
    table = _param(attn.relative_position_bias_table)
    bias = table[window_relative_index(window, attn.window_size)].permute(2, 0, 1)
    scores = (q * d ** -0.5) @ k.transpose(-2, -1) + bias
    if mask is not None:
        scores = scores + mask.double()[:, None]
    n_win = _ceil_windows(grid, (window, window))
    padded = (n_win[0] * window, n_win[1] * window)
    rolled = scatter_windows(_softmax(scores), n_win, (window, window), (window, window))
    shift = 0 if mask is None else _block_shift(block, grid)
    ys, xs = torch.meshgrid(torch.arange(padded[0]), torch.arange(padded[1]), indexing='ij')
    original = (((ys + shift) % padded[0]) * padded[1] + (xs + shift) % padded[1]).flatten()
    full = torch.zeros_like(rolled)
    full[:, original[:, None], original[None, :]] = rolled
    title = f'softmax in {window}x{window} windows' + (f', shifted by {shift}' if shift else '')
    kind = MapKind('window', title, full[:, real_rows(padded, grid)], padded)
    return dict(attention='Swin window attention', num_heads=h, head_dims=d, kinds=[kind],
                notes=[])


def cswin_stripe_maps(records, grid):
    """CSWin's cross-shaped window attention: each branch a softmax inside stripes (``idx`` 0:
    vertical, ``split_size`` wide; 1: horizontal; -1: the whole map), padded keys masked. Heads of
    the two branches are stacked (first the vertical ones), so their mean is the cross."""
    maps, kinds_of_heads = [], []
    height, width = grid
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing='ij')
    ys, xs = ys.flatten(), xs.flatten()
    head_dims = None
    for attn, args in records:
        q, k = (_heads(args[name][0].double(), attn.num_heads) for name in ('q', 'k'))
        head_dims = q.shape[-1]
        sw = attn.split_size
        if attn.idx == 0:
            same = xs[:, None] // sw == xs[None, :] // sw
        elif attn.idx == 1:
            same = ys[:, None] // sw == ys[None, :] // sw
        else:
            same = torch.ones(len(ys), len(ys), dtype=torch.bool)
        mask = torch.zeros(same.shape, dtype=torch.float64).masked_fill(~same, -math.inf)
        maps.append(_softmax((q * attn.scale) @ k.transpose(-2, -1), mask))
        kinds_of_heads.append({0: 'vertical', 1: 'horizontal', -1: 'whole map'}[attn.idx])
    full = torch.cat(maps)
    title = 'softmax in stripes (' + ' + '.join(kinds_of_heads) + '; LePE term not drawn)'
    return dict(attention='CSWin cross-shaped window attention', num_heads=full.shape[0],
                head_dims=head_dims, kinds=[MapKind('stripes', title, full, tuple(grid))],
                notes=[f'stripe width {records[0][0].split_size}'])


#: attention module class name -> function(module, recorded arguments, stage grid, block)
HANDLERS = {
    'FocusedLinearAttention': flatten_maps,
    'SpatialReductionAttention': sra_maps,
    'VanillaAttention': lavit_va_maps,
    'LessAttention': lavit_la_maps,
    'FocalAttention': focal_maps,
    'LinearAttention': l2vit_global_maps,
    'WindowMSA': swin_window_maps,
    'LePEAttention': cswin_stripe_maps,
}
#: subclasses whose maps the handler above cannot give
UNSUPPORTED = {'ClsFocusedLinearAttention': 'class-token focused linear attention (FLatten-DeiT)'}


def attention_type(module):
    """The :data:`HANDLERS` key of ``module``'s class (or a base class), or None."""
    for cls in type(module).__mro__:
        if cls.__name__ in UNSUPPORTED:
            return None
        if cls.__name__ in HANDLERS:
            return cls.__name__
    return None


def block_maps(stage, block, records, grid, block_module=None):
    """:class:`BlockMaps` of one block from its recorded ``(module, arguments)`` pairs."""
    types = [attention_type(module) for module, _ in records]
    if types and all(t == 'LePEAttention' for t in types):
        result = cswin_stripe_maps(records, grid)
    elif len(records) == 1:
        module, args = records[0]
        result = HANDLERS[types[0]](module, args, grid, block_module)
    else:
        raise RuntimeError(f'stage {stage} block {block}: several attention modules {types}')
    return BlockMaps(stage, block, result['attention'], tuple(grid), result['num_heads'],
                     result['head_dims'], result['kinds'], result['notes'])
