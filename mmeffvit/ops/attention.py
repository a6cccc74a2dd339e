"""Softmax attention: ``softmax(scale · q kᵀ + bias) v``, the kernel chosen inside.

:func:`attention` is the entry point where the scores themselves are not wanted: oneDNN row
blocks (:func:`onednn_attention`, CPU fp32 inference where the linears run oneDNN: torch's CPU
flash kernel runs its blocks on MKL's GEMM, slower there), torch's
``F.scaled_dot_product_attention`` elsewhere, or the explicit scores with
:class:`_SoftmaxValues` where SDPA would fall back to its math path anyway (a CPU bias that needs
a gradient). :func:`scored_attention` returns the scores too (LaViT's vanilla attention keeps
them for its less-attention layers and the attention residual), and :func:`softmax_values`
attends given scores. Figures: ``docs/ops.md`` (attention).
"""
import torch
import torch.nn.functional as F

from .linear import fused_linear, onednn_gemm, onednn_inference
from .policy import compiling


def masked_softmax(scores, key_mask=None):
    """Row softmax in at least fp32, returned in the scores' dtype; ``key_mask``, broadcastable
    to the scores (e.g. ``(B, 1, 1, Nk)``), True marks keys to ignore."""
    x = scores.float()
    if key_mask is not None:
        x = x.masked_fill(key_mask, torch.finfo(x.dtype).min)
    return x.softmax(dim=-1).to(scores.dtype)


class _SoftmaxValues(torch.autograd.Function):
    """``softmax(scores) @ v`` that stores the scores, not the probabilities.

    A layer whose scores are read later (LaViT's less-attention layers, the next attention
    residual) keeps its ``(B, H, N, Nk)`` scores alive anyway; saving the softmax output as
    well, as ``softmax`` and ``matmul`` do, held a second map of that size. Here the row
    log-sum-exp is saved and the backward recomputes the probabilities, with the softmax
    gradient ``P ⊙ (dO·vᵀ − rowsum(dO ⊙ O))`` of the attention identity (as flash attention's
    backward). At 1536² the stage-1 map of LaViT-T is 1.3 GiB. Softmax in fp32, as
    :func:`masked_softmax`.
    """

    @staticmethod
    def forward(ctx, scores, v):
        x = scores.float()
        probs = x.softmax(dim=-1)
        # log Σ exp(x) from row maxima (at the argmax p = exp(max x − lse)): logsumexp would
        # make two more maps of the scores' size
        lse = x.amax(dim=-1, keepdim=True) - probs.amax(dim=-1, keepdim=True).log()
        probs = probs.to(scores.dtype)
        out = probs @ v
        ctx.save_for_backward(scores, v, out, lse)
        ctx.set_materialize_grads(False)  # unused probabilities: None, not a map of zeros
        return out, probs

    @staticmethod
    def backward(ctx, grad_out, grad_probs):
        scores, v, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        probs = (scores.float() - lse).exp_()
        grad_scores = grad_v = None
        if ctx.needs_input_grad[1]:
            grad_v = probs.to(v.dtype).transpose(-2, -1) @ grad_out
        if ctx.needs_input_grad[0]:
            grad_p = (grad_out @ v.transpose(-2, -1)).float()
            if grad_probs is not None:  # the returned probabilities were used
                grad_p = grad_p.add_(grad_probs.float())
                row = (grad_p * probs).sum(-1, keepdim=True)
            else:
                row = (grad_out.float() * out.float()).sum(-1, keepdim=True)
            grad_scores = grad_p.sub_(row).mul_(probs).to(scores.dtype)
        return grad_scores, grad_v


def softmax_values(scores, v, key_mask=None, dropout=0.):
    """``(dropout(softmax(scores)) @ v, softmax(scores))`` for scores ``(B, H, N, Nk)`` and
    values ``(B, H, Nk, e)``; ``key_mask`` as :func:`masked_softmax`'s, ``dropout`` the
    probability on the attention weights (0 in inference). Where autograd records through
    the scores (no mask, no dropout) :class:`_SoftmaxValues` stores the scores only."""
    if (key_mask is None and dropout == 0. and torch.is_grad_enabled() and scores.requires_grad
            and not torch.jit.is_tracing() and not compiling()):
        return _SoftmaxValues.apply(scores, v)
    probs = masked_softmax(scores, key_mask)
    return F.dropout(probs, dropout) @ v if dropout else probs @ v, probs


# Query rows per block of _blocked_scores_attention: a 2 MiB fp32 block of scores
_SCORE_BLOCK_ELEMENTS = 1 << 19


def _blocked_scores_attention(q, k, v, scale, bias=None):
    """Inference: ``A = (q·scale) kᵀ (+ bias)`` and ``softmax(A) v``, by blocks of query rows.
    Each block's scores are made in a small buffer, copied into ``A`` (which the caller keeps)
    and turned into probabilities and output while in cache: no full-size probability map is
    written and ``A`` is not read back (stage 1 of LaViT-T at 800×1333: a 66 800 × 1025 map,
    274 MB, per pass). Same operators on the same rows as the unblocked form. Returns the
    output ``(B, N, H, e)`` and ``A``."""
    b, h, n, _ = q.shape
    nk = k.shape[-2]
    step = max(1, _SCORE_BLOCK_ELEMENTS // (b * h * nk))
    key_t = k.transpose(-2, -1)
    if bias is not None:
        bias = bias.expand(b, h, n, nk)
    scores = out = None
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        block = torch.matmul(q[:, :, rows] * scale, key_t)
        if bias is not None:
            block = block.add_(bias[:, :, rows].to(block.dtype))
        values = torch.matmul(masked_softmax(block).to(v.dtype), v)  # dtypes as autocast's
        if scores is None:
            scores = block.new_empty(b, h, n, nk)
            out = values.new_empty(b, n, h, values.shape[-1])
        scores[:, :, rows] = block
        out[:, rows] = values.transpose(1, 2)
    return out, scores


def scored_attention(q, k, v, scale, bias=None, key_mask=None, dropout=0., need_probs=True):
    """``A = (q·scale) kᵀ + bias`` and ``softmax(A) v`` with the scores ``A`` kept.

    Args:
        q, k, v (Tensor): ``(B, H, N, d)``, ``(B, H, Nk, d)``, ``(B, H, Nk, e)``.
        scale (float): Score scale.
        bias (Tensor, optional): Added to the scores (broadcastable to ``(B, H, N, Nk)``).
        key_mask (Tensor, optional): True marks keys the softmax ignores (not applied to ``A``).
        dropout (float): On the attention weights (0 in inference).
        need_probs (bool): Whether the probabilities are returned; without them, in inference,
            by blocks of query rows (no probability map is written).

    Returns:
        tuple: output ``(B, N, H, e)`` (possibly a view), ``A``, probabilities or None.
    """
    if (not need_probs and key_mask is None and not torch.is_grad_enabled() and dropout == 0.
            and not torch.jit.is_tracing()):
        out, scores = _blocked_scores_attention(q, k, v, scale, bias)
        return out, scores, None
    scores = (q * scale) @ k.transpose(-2, -1)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    out, probs = softmax_values(scores, v, key_mask, dropout)
    return out.transpose(1, 2), scores, probs


def onednn_attention_applies(q, k, v, dropout=0.) -> bool:
    """Whether :func:`onednn_attention` replaces SDPA (no mask): CPU fp32 inference where the
    linears run oneDNN (AVX-512)."""
    return (onednn_gemm() and dropout == 0. and q.dim() == 4
            and all(onednn_inference(t, k) for t in (q, v)) and q.shape[-1] == k.shape[-1]
            and k.shape[-2] == v.shape[-2])


def onednn_attention(q, k, v, scale, out=None):
    """``softmax(scale · q kᵀ) v`` for ``(B, H, N, d)`` queries and ``(B, H, M, d | d_v)`` keys
    and values, by blocks of query rows whose ``(rows, M)`` scores stay in cache (1 M elements,
    the fastest of the block sizes measured): two oneDNN GEMMs and a softmax each; no
    ``N × M`` map is written. ``out``: an optional ``(B, H, N, d_v)`` tensor or view (any
    strides) written and returned."""
    b, h, n, _ = q.shape
    m, width = k.shape[-2], v.shape[-1]
    out = q.new_empty(b, h, n, width) if out is None else out
    rows = max(1, (1 << 20) // m)
    # contiguous heads in one pass each (a strided head, e.g. a view into a qkv projection,
    # slows each of oneDNN's calls down more than the copy costs)
    query = (q if scale == 1 and q.is_contiguous()
             else torch.mul(q, scale, out=q.new_empty(q.shape)))
    key, value_t = k.contiguous(), v.transpose(-1, -2).contiguous()
    for i in range(b):
        for j in range(h):
            for start in range(0, n, rows):
                scores = fused_linear(query[i, j, start:start + rows], key[i, j], None)
                probs = torch.ops.aten._softmax.out(scores, -1, False, out=scores)
                out[i, j, start:start + rows] = fused_linear(probs, value_t[i, j], None)
    return out


def _row_block_attention(q, k, v, scale, valid=None):
    """:func:`onednn_attention` into a ``(B, N, H, e)`` buffer (returned as its ``(B, H, N, e)``
    view, whose token layout is then free); windows with padding (``valid``, see
    :func:`attention`) on their real tokens only, their padded rows zero."""
    windows, heads, n, _ = q.shape
    out = q.new_empty(windows, n, heads, v.shape[-1])
    out_heads = out.transpose(1, 2)
    if valid is None:
        onednn_attention(q, k, v, scale, out=out_heads)
        return out_heads
    per_image = valid.shape[0]
    padded = (~valid).any(-1).tolist()  # CPU tensors only: no device sync
    real = {i: valid[i].nonzero().squeeze(1) for i, pad in enumerate(padded) if pad}
    for first in range(0, windows, per_image):
        i = 0
        while i < per_image:
            if padded[i]:  # a padded window: its real tokens attend each other
                w = slice(first + i, first + i + 1)
                out[w].zero_()
                out_heads[w].index_copy_(2, real[i], onednn_attention(
                    *(t[w].index_select(2, real[i]) for t in (q, k, v)), scale))
                i += 1
                continue
            j = i
            while j < per_image and not padded[j]:
                j += 1
            run = slice(first + i, first + j)  # unpadded windows in one call
            onednn_attention(q[run], k[run], v[run], scale, out=out_heads[run])
            i = j
    return out_heads


def attention(q, k, v, *, scale, bias=None, key_mask=None, valid=None, dropout=0.):
    """``softmax(scale · q kᵀ + bias) v`` (scores not returned), ``(B, H, N, d)`` queries,
    ``(B, H, Nk, d)`` keys and ``(B, H, Nk, e)`` values (``e`` may differ from ``d``).

    Args:
        scale (float): Score scale.
        bias (Tensor, optional): Added to the scores (broadcastable to ``(B, H, N, Nk)``).
        key_mask (Tensor, optional): Same broadcast; True marks keys the softmax ignores.
        valid (Tensor, optional): Self-attention in windows padded at their end (CSWin's
            stripes): ``(W, N)``, True at the real tokens of window ``i`` of each image
            (``B`` a multiple of ``W``, windows image-major). Padding keys are ignored; the
            output rows of padding queries carry no meaning (zero where the kernel skips them)
            and are for the caller to crop.
        dropout (float): On the attention weights (0 in inference).

    Returns:
        Tensor: ``(B, H, N, e)``, possibly a view of a ``(B, N, H, e)`` buffer.
    """
    if valid is not None:
        if bias is not None or key_mask is not None:
            raise ValueError('attention: valid excludes bias and key_mask')
        if valid.dim() != 2 or q.shape[0] % valid.shape[0] or valid.shape[1] != k.shape[-2]:
            raise ValueError(f'valid must be (W, {k.shape[-2]}) with W dividing the batch '
                             f'{q.shape[0]}, got {tuple(valid.shape)}')
    if bias is None and key_mask is None and onednn_attention_applies(q, k, v, dropout):
        return _row_block_attention(q, k, v, scale, valid)
    if (bias is not None and bias.requires_grad and torch.is_grad_enabled()
            and q.device.type == 'cpu'):
        # CPU SDPA would take its explicit math path, which stores the maps as below
        return scored_attention(q, k, v, scale, bias, key_mask, dropout)[0].transpose(1, 2)
    mask = None if key_mask is None else ~key_mask  # SDPA: True = attend
    if valid is not None:
        mask = valid[:, None, None, :]
        if q.shape[0] > valid.shape[0]:
            mask = mask.repeat(q.shape[0] // valid.shape[0], 1, 1, 1)
    if bias is not None:
        mask = bias.to(q.dtype)
        if key_mask is not None:
            mask = mask.masked_fill(key_mask, float('-inf'))
    width = v.shape[-1]
    if q.device.type == 'cpu' and q.shape[-1] > width:
        # CPU's flash kernel needs one head size for q, k and v (else: the explicit math path
        # with full maps); zero value columns change nothing but the output's width
        v = F.pad(v, (0, q.shape[-1] - width))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)
    return out[..., :width]
