"""Softmax attention inside small windows, the kernel chosen inside: Swin's window attention
with its relative position bias and shift mask (Swin, sec. 3.2; :func:`window_attention`) and
Focal attention's, whose keys are rows of a shared bank read through an index (Focal
Transformer, sec. 3.2; :func:`gathered_window_attention`).

Both return the heads apart, ``(B·nW, n, h, e)`` (a transposed view where the kernel wrote
heads-major): the caller's head merge or window reverse is the one copy. Paths: the compiled
CPU operators in inference (one pass per window and head, keys in L1, nothing gathered or
summed into memory), :func:`~mmeffvit.ops.biased_attention.biased_attention` for a bias that
is trained (probabilities recomputed in backward; for gathered keys
:class:`_GatheredKeysAttention` gathers them again there), torch's
``F.scaled_dot_product_attention`` elsewhere. Figures: ``docs/ops.md``.
"""
import contextlib
import threading

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .biased_attention import (Workspace, _sdpa_with_terms, attention_backward,
                               biased_attention)
from .ext_loader import get_ext
from .policy import compiling, exporting
from .triton_kernels import selected as triton_selected


def _summed(bias, mask):
    """``bias + mask`` where both are given, else whichever is."""
    if bias is None:
        return mask
    return bias if mask is None else bias + mask


def _trained(bias):
    return bias is not None and bias.requires_grad and torch.is_grad_enabled()


def window_attention_ref(q, k, v, mask=None, scale=None, *, bias=None):
    """Reference of :func:`window_attention`: ``F.scaled_dot_product_attention`` on the summed
    mask ``bias + mask``, heads apart.

    Args:
        q, k, v (Tensor): ``(BW, h, n, d)`` windows' per-head queries, keys and values.
        mask (Tensor, optional): Additive ``(BW | 1, h | 1, n, n)`` mask (e.g. the shift mask).
        scale (float, optional): Score scale; default ``d ** -0.5``.
        bias (Tensor, optional): Additive ``(BW | 1, h, n, n)`` bias.

    Returns:
        Tensor: ``(BW, n, h, e)``.
    """
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=_summed(bias, mask), scale=scale)
    return out.transpose(1, 2)


def gathered_window_attention_ref(q, bank, index, bias=None, key_mask=None, scale=None):
    """Reference of :func:`gathered_window_attention`: the keys and values gathered from the
    bank by indexing, the additive mask ``bias + key_mask`` built, then
    :func:`window_attention_ref`. Arguments and result as there.
    """
    bw, h, nq, d = q.shape
    nw, nk = index.shape
    kv = bank[:, index]  # (B, nW, nk, 2, h·d)
    kv = kv.view(-1, nw, nk, 2, h, d).permute(3, 0, 1, 4, 2, 5).reshape(2, bw, h, nk, d)
    mask = None if bias is None else (bias if bias.dim() == 4 else bias[None])
    if key_mask is not None:
        per_window = key_mask[:, None, None]
        mask = per_window if mask is None else mask + per_window
        if mask.shape[0] == nw:  # one mask per window of every image
            mask = mask.expand(bw // nw, nw, -1, nq, nk).reshape(bw, -1, nq, nk)
    return window_attention_ref(q, kv[0], kv[1], mask, scale)


def _compiled_applies(function, *tensors):
    """Whether the compiled CPU operator ``function`` runs on ``tensors`` (None ones skipped):
    CPU float32 tensors (index tensors aside), nothing needs a gradient, no autocast,
    tracing, compiling or dispatch mode (the MAC counters see ``scaled_dot_product_attention``),
    and a built ``mmeffvit._ext`` that has it."""
    tensors = [t for t in tensors if t is not None]
    if not (all(t.device.type == 'cpu' and t.dtype in (torch.float32, torch.int64)
                for t in tensors)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
            and not torch.is_autocast_enabled('cpu') and not torch.jit.is_tracing()
            and not compiling() and _get_current_dispatch_mode() is None
            and not torch._C._are_functorch_transforms_active()):
        return False
    ext = get_ext(tensors[0])
    return ext is not None and hasattr(ext, function)


def _window_attention_applies(q, k, v, mask=None):
    """Whether :func:`window_attention` may run the compiled CPU operator (see
    :func:`_compiled_applies`)."""
    if any(t.dtype != torch.float32 for t in (q, k, v)):
        return False
    return _compiled_applies('window_attention_forward', q, k, v, mask)


def _gathered_window_attention_applies(q, bank, index, bias=None, key_mask=None):
    """Whether :func:`gathered_window_attention` may run the compiled CPU operator."""
    if any(t is not None and t.dtype != torch.float32 for t in (q, bank, bias, key_mask)):
        return False
    return _compiled_applies('gathered_window_attention_forward', q, bank, index, bias,
                             key_mask)


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
    tracing = compiling()  # no cache lookup inside a graph: the rows are traced
    if not tracing:
        key = (index.data_ptr(), index._version, tuple(index.shape), images, bank_len,
               num_heads)
        hit = _head_rows_cache.get(key)
        if hit is not None and hit[0] is index:
            return hit[1]
    device = index.device
    image = torch.arange(images, device=device)[:, None, None, None]
    token = index[None, :, None, :] + bank_len * image
    part = torch.arange(2, device=device)[:, None, None, None, None]
    head = torch.arange(num_heads, device=device)[None, None, None, :, None]
    rows = ((token[None] * 2 + part) * num_heads + head).reshape(-1)
    if tracing:
        return rows
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
    if workspace is None and not (torch.is_grad_enabled() and bank.requires_grad
                                  or compiling()):
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


def _heads_apart(out):
    """``(BW, h, n, e)`` as ``(BW, n, h, e)``: a view, copied while exporting. The output
    strides of SDPA differ between its fused kernel (which the export traces) and the
    decomposition that ONNX runs, and a caller's reshape traced as a view of the one cannot
    view the other (``contiguous()`` would be traced away as a no-op)."""
    out = out.transpose(1, 2)
    return out.clone(memory_format=torch.contiguous_format) if exporting() else out


def window_attention_mask(bias, images):
    """An additive mask ``(nW, h|1, n, N)`` of one image's windows, repeated for ``images``
    images so that it lines up with queries ``(images·nW, h, n, d)``. torch's fused CPU
    attention wants a 4-D mask, and a 5-D ``(B, nW, ...)`` query falls back to its slow
    composite path (measured slower), so the mask is repeated rather than broadcast."""
    return bias if images == 1 else bias.repeat(images, 1, 1, 1)


def _per_image(mask, windows, images):
    """A mask ``(nW | 1, ...)`` of one image's ``windows`` lined up with ``images`` images."""
    return window_attention_mask(mask.expand(windows, *mask.shape[1:]), images)


def _triton_applies(q, k, v, bias, mask, dropout):
    """Whether :func:`window_attention` runs the Triton op: selected by the policy (see
    :func:`mmeffvit.ops.triton_kernels.selected`), no dropout, one dtype, windows of at most
    256 tokens, keys and values for each query (``(BW, h, n, ·)``; other shapes go to SDPA,
    which takes or refuses them), and bias and mask floating ``(BW | 1, h | 1, n, n)`` terms."""
    bw, h, n, _ = q.shape
    terms = [t for t in (bias, mask) if t is not None]
    if dropout or n > 256 or not q.dtype == k.dtype == v.dtype:
        return False
    if k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        return False
    if any(t.dim() != 4 or t.shape[0] not in (1, bw) or t.shape[1] not in (1, h)
           or t.shape[2:] != (n, n) or not t.is_floating_point() for t in terms):
        return False
    return triton_selected(q, k, v, *terms)


def window_attention(q, k, v, mask=None, scale=None, *, bias=None, dropout=0.):
    """``softmax(q·kᵀ·scale + bias + mask)·v`` per window and head (Swin, sec. 3.2, Eq. 4).

    Args:
        q, k, v (Tensor): ``(BW, h, n, d)`` per-head queries, keys, values (``v``: last dim e).
        mask (Tensor, optional): Additive ``(BW | 1, h | 1, n, n)`` term without a gradient
            (the shift mask, or bias and shift mask summed and cached by the caller).
        scale (float, optional): Score scale; default ``d ** -0.5``.
        bias (Tensor, optional): Additive ``(BW | 1, h, n, n)`` relative position bias, which
            may need a gradient (its backward recomputes the probabilities).
        dropout (float): Dropout on the attention weights.

    Returns:
        Tensor: ``(BW, n, h, e)``; a transposed view except on the compiled path.

    In CPU fp32 inference without dropout one compiled pass per (window, head) with the keys in
    L1 (float tolerance: its summation order and exponential differ from torch's kernels).
    With the Triton kernels selected (``use_kernels(triton=True)``): the op
    ``mmeffvit::window_attention``, one launch forward and one backward (plus the bias
    gradient's sum), bias and mask read in place.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if _triton_applies(q, k, v, bias, mask, dropout):
        out, _ = torch.ops.mmeffvit.window_attention(q, k, v, bias, mask, float(scale))
        return out
    if _trained(bias):
        out = biased_attention(q, k, v, bias, mask, scale, dropout)
        return _heads_apart(out)
    full = _summed(bias, mask)
    if not dropout and _window_attention_applies(q, k, v, full):
        bw, h, n, _ = q.shape
        out = get_ext(q).window_attention_forward(q, k, v, full, float(scale))
        return out.view(bw, n, h, v.shape[-1])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=full, dropout_p=dropout, scale=scale)
    return _heads_apart(out)


def gathered_window_attention(q, bank, index, bias=None, key_mask=None, scale=None, *,
                              dropout=0.):
    """Softmax attention of windows whose keys and values are rows of a shared bank, Focal
    attention's window, ring and pooled keys (Focal Transformer, sec. 3.2, Eq. 2):
    ``softmax(q·kᵀ·scale + bias + key_mask)·v`` with ``k, v = gather_keys(bank, index, h)``.

    Args:
        q (Tensor): ``(B·nW, h, nq, d)`` per-head queries of every window (image-major).
        bank (Tensor): ``(B, M, 2, h·d)`` key (``[:, :, 0]``) and value (``[:, :, 1]``) rows.
        index (LongTensor): ``(nW, nk)`` bank row of each window's key slots.
        bias (Tensor, optional): ``(1, h | 1, nq, nk)`` or ``(h | 1, nq, nk)`` additive bias,
            the same for every window; may need a gradient.
        key_mask (Tensor, optional): ``(nW | 1, nk)`` additive logit per window and key slot.
        scale (float, optional): Score scale; default ``d ** -0.5``.
        dropout (float): Dropout on the attention weights.

    Returns:
        Tensor: ``(B·nW, nq, h, d)``; a transposed view except on the compiled path.

    CPU fp32 inference without dropout: the compiled operator reads each window's keys through
    ``index`` and adds ``bias`` and ``key_mask`` to its scores, so neither the gathered keys
    ``(B·nW, h, nk, d)`` ×2 nor the summed mask ``(B·nW, h, nq, nk)`` is written. A trained
    bias on the CPU without dropout: :class:`_GatheredKeysAttention` (only the bank kept for
    backward). Elsewhere the keys gathered (into the buffer of an open
    :func:`reused_gather_buffer` scope where nothing needs their gradient) and SDPA.
    """
    bw, h, nq, d = q.shape
    if scale is None:
        scale = d ** -0.5
    images = bw // index.shape[0]
    if bias is not None:
        bias = (bias if bias.dim() == 4 else bias[None]).to(q.dtype)
    trained = _trained(bias)
    if (not trained and not dropout
            and _gathered_window_attention_applies(q, bank, index, bias, key_mask)):
        out = get_ext(q).gathered_window_attention_forward(
            q, bank, index, None if bias is None else bias[0], key_mask, float(scale))
        return out.view(bw, nq, h, d)
    if key_mask is not None:
        key_mask = key_mask[:, None, None].to(q.dtype)
    if trained:  # bias and key mask stay apart: the bias gradient is summed over less
        mask = None if key_mask is None else _per_image(key_mask, index.shape[0], images)
        if q.device.type == 'cpu' and not dropout and not compiling():
            out = _GatheredKeysAttention.apply(q, bank, index, bias, mask, scale)
        else:
            out = biased_attention(q, *gather_keys(bank, index, h), bias, mask, scale, dropout)
        return _heads_apart(out)
    mask = _summed(bias, key_mask)
    if mask is not None:
        mask = _per_image(mask, index.shape[0], images)
    out = F.scaled_dot_product_attention(q, *gather_keys(bank, index, h), attn_mask=mask,
                                         dropout_p=dropout, scale=scale)
    return _heads_apart(out)
