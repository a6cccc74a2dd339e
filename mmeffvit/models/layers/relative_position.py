"""Relative position bias of windowed attention (Swin, Liu et al., ICCV 2021, sec. 3.2).

The index of every (query, key) pair of a window into a learned table of relative offsets,
the additive mask of shifted windows, the bicubic resize of a table to another window, and
Swin's window multi-head self-attention that uses them (FLatten-Swin's ``'S'`` stages,
L²ViT's local windows without the bias, the Focal Transformer's window table); and attention
with a trained bias whose backward recomputes the probabilities (:func:`biased_attention`, and
:func:`gathered_biased_attention` for keys gathered from a bank, as the Focal Transformer's).
"""
import contextlib
import functools
import math
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...ops.window_attention import window_attention, window_attention_applies
from ...utils import square_side
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

    def strips(size):
        label = torch.zeros(size, dtype=torch.long, device=device)
        label[size - window:] = 1
        label[size - shift:] = 2
        return label

    region = strips(height)[:, None] * 3 + strips(width)[None, :]
    region = region.view(height // window, window, width // window, window)
    region = region.permute(0, 2, 1, 3).reshape(-1, window * window)
    differs = region[:, :, None] != region[:, None, :]
    return differs.float() * SHIFT_MASK_VALUE


def cached_shifted_window_mask(height, width, window, shift, device=None):
    """:func:`shifted_window_mask`, built once per geometry and device (shared: read only;
    tensors made under ``inference_mode`` are kept apart, autograd refuses to save them)."""
    return _shifted_window_mask(height, width, window, shift, device,
                                torch.is_inference_mode_enabled())


@functools.lru_cache(maxsize=32)
def _shifted_window_mask(height, width, window, shift, device, inference):
    return shifted_window_mask(height, width, window, shift, device)


def window_attention_mask(bias, images):
    """An additive mask ``(nW, h|1, n, N)`` of one image's windows, repeated for ``images``
    images so that it lines up with queries ``(images·nW, h, n, d)``. torch's fused CPU
    attention wants a 4-D mask, and a 5-D ``(B, nW, ...)`` query falls back to its slow
    composite path (measured slower), so the mask is repeated rather than broadcast."""
    return bias if images == 1 else bias.repeat(images, 1, 1, 1)


def _sum_to(grad, shape):
    """Sum ``grad`` over the dimensions that ``shape`` broadcast (size 1 there)."""
    dims = [i for i, (g, n) in enumerate(zip(grad.shape, shape)) if n == 1 and g != 1]
    return grad.sum(dims, keepdim=True) if dims else grad


def _terms_into(workspace, bias, mask, shape):
    """``bias + mask`` (mask may be None) broadcast to ``shape``, written into the workspace's
    ``'scores'`` buffer."""
    dtype = bias.dtype if mask is None else torch.promote_types(bias.dtype, mask.dtype)
    out = workspace.get('scores', shape, dtype, bias.device)
    return out.copy_(bias.expand(shape)) if mask is None else torch.add(bias, mask, out=out)


def _sdpa_with_terms(q, k, v, bias, mask, scale, dropout_p=0., workspace=None):
    """``F.scaled_dot_product_attention`` with the additive mask ``bias + mask`` (either None;
    their sum written into the buffer of a :class:`Workspace` when given)."""
    if bias is not None and mask is not None and workspace is not None:
        full = _terms_into(workspace, bias, mask, torch.broadcast_shapes(bias.shape, mask.shape))
    else:
        full = mask if bias is None else (bias if mask is None else bias + mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=full, dropout_p=dropout_p,
                                          scale=scale)


class _RecomputedBiasAttention(torch.autograd.Function):
    """``softmax(q·kᵀ·scale + bias + mask)·v`` whose backward recomputes the probabilities.

    With a bias that needs a gradient, torch's fused CPU attention is not used and its
    composite path stores the scores' probabilities (and the summed mask) for backward, a
    tensor as large as the scores per block. Here the forward runs the fused kernel and only
    q, k, v, the output and the two small mask terms are kept; the backward rebuilds the
    probabilities of this one block (the standard softmax-attention gradients) and returns
    the bias gradient summed over the windows it was broadcast to.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale):
        # detached: torch picks its composite kernel for a mask that requires a gradient,
        # even with autograd off (the bias gradient is this function's own)
        out = _sdpa_with_terms(q, k, v, bias.detach(), mask, scale)
        ctx.save_for_backward(q, k, v, bias, mask, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, mask, out = ctx.saved_tensors
        grads = attention_backward(q, k, v, bias, mask, out, grad_out, ctx.scale,
                                   ctx.needs_input_grad[3])
        return grads + (None, None)


def attention_backward(q, k, v, bias, mask, out, grad_out, scale, bias_grad=True,
                       workspace=None):
    """Gradients of ``out = softmax(q·kᵀ·scale + bias + mask)·v`` for q, k, v and ``bias``
    (summed to its broadcast shape; None unless ``bias_grad``), the probabilities recomputed.

    ``q (…, n, d)``, ``k (…, N, d)``, ``v (…, N, e)`` share their leading dimensions; ``bias``
    and ``mask`` (None allowed) broadcast to ``(…, n, N)``. With a :class:`Workspace` (no
    autograd) the scores and their gradient, and the gradients of k and v (which the caller
    must consume before the workspace's next use), are written into its buffers.
    """
    lead, n, big_n = q.shape[:-2], q.shape[-2], k.shape[-2]
    # batched 3-D GEMMs on (B'·h, n|N, d): the additive terms are written once and the scaled
    # q·kᵀ accumulated into them in place (baddbmm), one pass over the scores where matmul,
    # scale and the two additions took four
    full = lead + (n, big_n)
    if workspace is not None:
        add = _terms_into(workspace, bias, mask, full)
    elif mask is None:  # a fresh tensor: the bias itself must stay as it is
        add = bias.expand(full).clone(memory_format=torch.contiguous_format)
    else:
        add = bias + mask
        if add.shape != full or not add.is_contiguous():
            add = add.expand(full).contiguous()
    q3, k3 = q.reshape(-1, n, q.shape[-1]), k.reshape(-1, big_n, k.shape[-1])
    scores = add.view(-1, n, big_n).baddbmm_(q3, k3.transpose(1, 2), alpha=scale)
    if scores.dtype in (torch.float16, torch.bfloat16):  # softmax in fp32, as autocast
        probs = scores.float().softmax(-1).to(scores.dtype)
    elif torch.is_grad_enabled():  # double backward: out= is not differentiable
        probs = scores.softmax(-1)
    else:  # in place: one fresh (…, n, N) map fewer (each costs its page faults on the CPU)
        probs = torch.softmax(scores, -1, out=scores)
    del scores, add
    go3, v3 = grad_out.reshape(-1, n, v.shape[-1]), v.reshape(-1, big_n, v.shape[-1])

    def buffer(name, shape):  # None: a fresh tensor
        return None if workspace is None else workspace.get(name, shape, q.dtype, q.device)

    grad_v = torch.bmm(probs.transpose(1, 2), go3, out=buffer('grad_v', v3.shape))
    # dL/dscores = P ∘ (dO·vᵀ - rowsum(dO ∘ O)): the row term enters as the GEMM's input
    row = (go3 * out.reshape(go3.shape)).sum(-1, keepdim=True)
    grad_s = probs.mul_(torch.baddbmm(row, go3, v3.transpose(1, 2), beta=-1,
                                      out=buffer('grad_scores', probs.shape)))
    grad_q = torch.bmm(grad_s, k3).mul_(scale)
    grad_k = torch.bmm(grad_s.transpose(1, 2), q3, out=buffer('grad_k', k3.shape)).mul_(scale)
    grad_bias = None
    if bias_grad:
        grad_bias = _sum_to(grad_s.view(full), bias.shape)
        if workspace is not None and grad_bias.data_ptr() == grad_s.data_ptr():
            grad_bias = grad_bias.clone()  # not broadcast: returned, so not the buffer
    return grad_q.view(q.shape), grad_k.view(k.shape), grad_v.view(v.shape), grad_bias


class Workspace:
    """Named flat buffers, each grown to the largest request and handed out as views.

    On the CPU every large tensor allocated anew is faulted in page by page on its first write
    (glibc maps blocks this large anew and unmaps them when freed), which made an
    ``index_select`` into a new tensor four times slower than into a written one
    (``docs/ops.md``). Blocks that run one after another reuse one set of buffers instead.
    """

    def __init__(self):
        self.buffers = {}
        self.calls = 0  # attention calls of the forward that made it (see _GatheredKeysAttention)

    def get(self, name, shape, dtype, device):
        numel = math.prod(shape)
        key = (name, dtype, device)
        buf = self.buffers.get(key)
        if buf is None or buf.numel() < numel:
            self.buffers.pop(key, None)  # free the smaller one first
            buf = self.buffers[key] = torch.empty(numel, dtype=dtype, device=device)
        return buf[:numel].view(shape)

    def clear(self):
        self.buffers.clear()


_workspaces = threading.local()


@contextlib.contextmanager
def reused_gather_buffer():
    """Inside the block, :func:`gather_keys` without autograd writes into one
    :class:`Workspace` buffer, reused by every call; each block's keys must be consumed
    before the next gather. A backbone's forward opens the scope. The attention calls that
    autograd records keep the workspace for their backward (which reuses its buffers and
    frees them at its end), otherwise it is freed when the scope closes.
    """
    previous = getattr(_workspaces, 'current', None)
    _workspaces.current = Workspace()
    try:
        yield
    finally:
        _workspaces.current = previous


def current_workspace():
    """The :class:`Workspace` of the innermost :func:`reused_gather_buffer` scope, or None."""
    return getattr(_workspaces, 'current', None)


def _head_rows(index, images, bank_len, num_heads):
    """Row of every (k|v, image, window, head, slot) in the bank viewed as ``(B·M·2·h, d)``."""
    key = (index.data_ptr(), index._version, tuple(index.shape), images, bank_len, num_heads)
    hit = _head_rows_cache.get(key)
    if hit is not None and hit[0] is index:
        return hit[1]
    device = index.device
    token = index[None, :, None, :] + bank_len * torch.arange(images, device=device)[:, None,
                                                                                      None, None]
    part = torch.arange(2, device=device)[:, None, None, None, None]
    head = torch.arange(num_heads, device=device)[None, None, None, :, None]
    rows = ((token[None] * 2 + part) * num_heads + head).reshape(-1)
    if len(_head_rows_cache) >= 8:  # a few geometries live at a time
        _head_rows_cache.clear()
    _head_rows_cache[key] = (index, rows)  # holding the index keeps its address unique
    return rows


_head_rows_cache = {}


def gather_keys(bank, index, num_heads, workspace=None):
    """Keys and values ``(B·nW, h, N, d)``, each contiguous, of every window from the bank
    ``(B, M, 2, C)``: ``k[i·nW + w, j, s] = bank[i, index[w, s], 0, j·d:(j+1)·d]``.

    One ``index_select`` of the bank's ``d``-wide rows in head-major order, so that the
    attention's batched GEMMs (and :func:`attention_backward`) read them without a copy
    (measured faster with the copies it saves, ``docs/ops.md``); without
    autograd through the bank, into the buffer of ``workspace`` or of the open
    :func:`reused_gather_buffer` scope.
    """
    b, m, _, c = bank.shape
    nw, n = index.shape
    d = c // num_heads
    rows = _head_rows(index, b, m, num_heads)
    flat = bank.reshape(b * m * 2 * num_heads, d)
    if workspace is None and not (torch.is_grad_enabled() and bank.requires_grad):
        workspace = current_workspace()
    if workspace is None:
        kv = flat.index_select(0, rows)
    else:
        kv = torch.index_select(flat, 0, rows,
                                out=workspace.get('keys', (rows.numel(), d), bank.dtype,
                                                  bank.device))
    kv = kv.view(2, b * nw, num_heads, n, d)
    return kv[0], kv[1]


def scatter_key_grads(grad_k, grad_v, bank, index):
    """The backward of :func:`gather_keys`: ``grad_k``, ``grad_v`` summed into a zero bank."""
    b, m, _, c = bank.shape
    d = grad_k.shape[-1]
    rows = _head_rows(index, b, m, c // d)
    half = rows.numel() // 2
    grad = bank.new_zeros(b * m * 2 * (c // d), d)
    grad.index_add_(0, rows[:half], grad_k.reshape(-1, d))
    grad.index_add_(0, rows[half:], grad_v.reshape(-1, d))
    return grad.view(bank.shape)


class _GatheredKeysAttention(torch.autograd.Function):
    """Attention with a trained bias over keys gathered from a bank, gathered again in backward.

    Autograd through :func:`gather_keys` would keep the gathered keys and values of every
    block for backward: for the Focal Transformer 4-5x the map (each window reads 182-230
    keys). This keeps the bank (about the map's size) and the index instead and gathers again
    in backward, where :func:`attention_backward` recomputes the probabilities as
    :func:`biased_attention` does; the key gradients are scattered back into the bank
    (``index_add_``, the backward of the gather).
    """

    @staticmethod
    def forward(ctx, q, bank, index, bias, mask, scale):
        # the forward's workspace serves the backward too: the blocks' backwards run one
        # after another, and the first call's (the last backward) frees it
        ctx.workspace = current_workspace()
        k, v = gather_keys(bank, index, q.shape[1])
        out = _sdpa_with_terms(q, k, v, None if bias is None else bias.detach(), mask, scale,
                               workspace=ctx.workspace)  # detached: see _RecomputedBiasAttention
        ctx.save_for_backward(q, bank, index, bias, mask, out)
        ctx.scale = scale
        if ctx.workspace is not None:
            ctx.call = ctx.workspace.calls
            ctx.workspace.calls += 1
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, bank, index, bias, mask, out = ctx.saved_tensors
        workspace = None if torch.is_grad_enabled() else ctx.workspace
        k, v = gather_keys(bank, index, q.shape[1], workspace)
        grad_q, grad_k, grad_v, grad_bias = attention_backward(
            q, k, v, bias, mask, out, grad_out, ctx.scale, ctx.needs_input_grad[3], workspace)
        grad_bank = scatter_key_grads(grad_k, grad_v, bank, index)
        if workspace is not None and ctx.call == 0:
            workspace.clear()
        return grad_q, grad_bank, None, grad_bias, None, None


def gathered_biased_attention(q, bank, index, bias, mask, scale):
    """``softmax(q·kᵀ·scale + bias + mask)·v`` with ``k, v = gather_keys(bank, index, h)``,
    keeping only the bank for backward (CPU, no dropout; :class:`_GatheredKeysAttention`)."""
    return _GatheredKeysAttention.apply(q, bank, index, bias, mask, scale)


def biased_attention(q, k, v, bias, mask=None, scale=None, dropout_p=0.):
    """``F.scaled_dot_product_attention`` with the additive mask ``bias + mask``.

    ``bias`` (e.g. a relative position bias, ``(1|B', h, n, N)``) may need a gradient;
    ``mask`` (``(B'|1, 1|h, n|1, N)``, no gradient) may be None. When autograd records through
    ``bias`` on a CPU without dropout, :class:`_RecomputedBiasAttention` keeps the fused kernel
    and stores no probabilities; otherwise torch's own dispatch runs on the summed mask.
    """
    if (bias is not None and bias.requires_grad and torch.is_grad_enabled()
            and q.device.type == 'cpu' and not dropout_p):
        if scale is None:
            scale = q.shape[-1] ** -0.5
        return _RecomputedBiasAttention.apply(q, k, v, bias, mask, scale)
    return _sdpa_with_terms(q, k, v, bias, mask, scale, dropout_p)


def cache_allowed(*tables):
    """Whether tensors derived from the parameters ``tables`` may be cached: not while autograd
    records through them (then each call must gather them again to get their gradients)."""
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tables))


def tables_key(*tables):
    """Cache key part that changes whenever a table is updated in place, moved or cast (and
    with inference mode, whose tensors autograd cannot save)."""
    return (torch.is_inference_mode_enabled(), ) + tuple(
        (t._version, t.data_ptr(), t.dtype, t.device) for t in tables)


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
        self._index_cache = {}
        self._mask_cache = {}

    def relative_bias(self, window):
        """``(h, window², window²)`` bias for a window of side ``window`` (≤ the table's)."""
        table = self.relative_position_bias_table
        if window == self.window_size:
            index = self.relative_position_index
        else:
            key = (window, table.device)
            if key not in self._index_cache:
                self._index_cache[key] = relative_position_index(window, self.window_size).to(
                    table.device)
            index = self._index_cache[key]
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
        """``softmax(q·kᵀ·d^-1/2 + bias + mask)·v`` on per-head ``(B·nW, h, w², d)`` windows,
        heads merged into ``(B·nW, w², C)``, before ``proj`` (callers that project outside
        the windows call this and ``proj`` themselves).

        Through ``F.scaled_dot_product_attention``: its fused CPU/GPU kernels never store the
        probabilities for backward. In CPU inference without dropout through
        :func:`mmeffvit.ops.window_attention` (one compiled pass per window and head; stage 3
        of FLatten-Swin-T at 800×1333: see ``docs/logs/profiles.md``, fourteenth round).
        """
        bw, h, n, _ = q.shape
        images = 1 if mask is None else bw // mask.shape[0]
        drop = self.attn_drop.p if self.training else 0.
        if self.window_size is not None and not cache_allowed(self.relative_position_bias_table):
            # training the table: its bias and the shift mask stay apart (see biased_attention)
            bias = self.relative_bias(window)[None].to(q.dtype)
            if mask is not None:
                mask = window_attention_mask(mask[:, None].to(q.dtype), images)
            out = biased_attention(q, k, v, bias, mask, self.qk_scale, drop)
        else:
            attn_mask = self.attention_mask(window, mask, q.dtype, images)
            if drop == 0 and window_attention_applies(q, k, v, attn_mask):
                return window_attention(q, k, v, attn_mask, self.qk_scale)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=drop,
                                                 scale=self.qk_scale)
        return out.transpose(1, 2).reshape(bw, n, h * v.shape[-1])


def resize_bias_table(table, rows, what='relative_position_bias_table'):
    """Bicubic resize of a ``((2w-1)², h)`` relative bias table to ``rows`` = ``(2w'-1)²``.

    Any square table works (Focal's pooled tables, whose sides need not be ``2w-1``); timm's
    ``resize_rel_pos_bias_table_simple`` takes a window and assumes ``2w-1``. Runs in fp32.
    """
    src, dst = square_side(table.shape[0], what), square_side(rows, what)
    grid = table.t().reshape(1, -1, src, src).float()
    grid = F.interpolate(grid, size=(dst, dst), mode='bicubic', align_corners=False)
    return grid.reshape(-1, dst * dst).t().contiguous().to(table.dtype)
