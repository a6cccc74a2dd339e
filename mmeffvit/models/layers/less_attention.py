"""Vanilla and less attention of LaViT (Zhang et al., CVPR 2024, sec. 3.2, Eq. 4-5)."""
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...ops.linear import onednn_attention, onednn_attention_applies
from .linear import Linear, project_heads
from .spatial_reduction_attention import SpatialReductionMixin


class FactoredScores(NamedTuple):
    """Pre-softmax scores kept as their factors, ``A = query · keyᵀ``.

    A VA layer's scores ``(q·scale) kᵀ`` have rank ``d``, and the AR residual of the next
    stage (sec. 3.3, Eq. 6: a depthwise conv over the query grid, a 1×1 conv over heads,
    LayerScale) is linear in the queries, so it is a product too: ``conv(q) kᵀ`` plus its bias.
    Where a stage's last scores are read only by the next AR module (no LA layer in the stage)
    they are carried in this form and the next layer attends with fused SDPA on concatenated
    factors: the ``N × N_k`` maps of the global stages are never written (LaViT-T's stage-1
    map at 1536² is 1.3 GiB), and the cost keeps the fused kernel's scaling.

    Attributes:
        query (Tensor): ``(B, H, N_q, F)``, the scale folded in.
        key (Tensor): ``(B, H or 1, N_k, F)``.
        invariant_tail (int): Trailing feature columns whose product is constant along every
            row (a per-head bias on all keys): the row softmax does not see them.
    """
    query: torch.Tensor
    key: torch.Tensor
    invariant_tail: int = 0

    def dense(self):
        """The ``(B, H, N_q, N_k)`` scores."""
        return self.query @ self.key.transpose(-2, -1)


def masked_softmax(scores, key_mask=None):
    """Row softmax in at least fp32; ``key_mask (B, 1, 1, Nk)`` True marks keys to ignore.

    The mask is applied here only, never to the scores handed to the next layer, so the
    learned transforms Θ/Ψ always see finite values.
    """
    x = scores.float()
    if key_mask is not None:
        x = x.masked_fill(key_mask, torch.finfo(x.dtype).min)
    return x.softmax(dim=-1).to(scores.dtype)


class _SoftmaxValues(torch.autograd.Function):
    """``softmax(scores) @ v`` that stores the scores, not the probabilities.

    A VA layer whose scores are read later (by an LA layer or the next AR module) keeps its
    ``(B, H, N, Nk)`` scores alive anyway; saving the softmax output as well, as
    ``softmax`` and ``matmul`` do, held a second map of that size. Here the row log-sum-exp is
    saved and the backward recomputes the probabilities, with the softmax gradient
    ``P ⊙ (dO·vᵀ − rowsum(dO ⊙ O))`` of the attention identity (as flash attention's backward).
    At 1536² the stage-1 map of LaViT-T is 1.3 GiB. Softmax in fp32, as :func:`masked_softmax`.
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


# Query rows per block of scores_softmax_values: a 2 MiB fp32 block of scores
_SCORE_BLOCK_ELEMENTS = 1 << 19


def scores_softmax_values(q, k, v, scale, residual=None):
    """Inference: ``A = (q·scale) kᵀ (+ residual)`` and ``softmax(A) v``, by blocks of query
    rows. Each block's scores are made in a small buffer, copied into ``A`` (which the caller
    keeps for the next layers) and turned into probabilities and output while in cache: no
    full-size probability map is written and ``A`` is not read back (stage 1 of LaViT-T at
    800×1333: a 66 800 × 1025 map, 274 MB, per pass). Same operators on the same rows as the
    unblocked form.

    Args: q ``(B, H, N, d)``, k ``(B, H, Nk, d)``, v ``(B, H, Nk, e)``, residual broadcastable to
    ``(B, H, N, Nk)``. Returns the output ``(B, N, H, e)`` and ``A`` ``(B, H, N, Nk)``.
    """
    b, h, n, _ = q.shape
    nk = k.shape[-2]
    step = max(1, _SCORE_BLOCK_ELEMENTS // (b * h * nk))
    key_t = k.transpose(-2, -1)
    if residual is not None:
        residual = residual.expand(b, h, n, nk)
    scores = out = None
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        block = torch.matmul(q[:, :, rows] * scale, key_t)
        if residual is not None:
            block = block.add_(residual[:, :, rows].to(block.dtype))
        values = torch.matmul(masked_softmax(block).to(v.dtype), v)  # dtypes as autocast's
        if scores is None:
            scores = block.new_empty(b, h, n, nk)
            out = values.new_empty(b, n, h, values.shape[-1])
        scores[:, :, rows] = block
        out[:, rows] = values.transpose(1, 2)
    return out, scores


class _ScoreAttention(SpatialReductionMixin, nn.Module):
    """What VA and LA layers share: PVT's key/value reduction, the heads, and the attention of
    explicit scores, ``proj(softmax(A) V)``."""

    def __init__(self, embed_dims, num_heads, sr_ratio):
        super().__init__()
        self.build_spatial_reduction(embed_dims, sr_ratio)
        if sr_ratio > 1:  # its input is a channels-last view of the tokens: no NCHW copy
            self.sr.to(memory_format=torch.channels_last)
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims {embed_dims} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads

    def attend(self, scores, v, key_mask):
        """Scores ``(B, H, N, Nk)``, values ``(B, H, Nk, d)`` → output ``(B, N, H·d)`` and the
        probabilities."""
        b, h, n, _ = scores.shape
        if (key_mask is None and not (self.training and self.attn_drop.p > 0)
                and torch.is_grad_enabled() and scores.requires_grad
                and not torch.jit.is_tracing()):
            out, probs = _SoftmaxValues.apply(scores, v)
        else:
            probs = masked_softmax(scores, key_mask)
            out = self.attn_drop(probs) @ v
        out = out.transpose(1, 2).reshape(b, n, h * v.shape[-1])
        return self.proj_drop(self.proj(out)), probs


class VanillaAttention(_ScoreAttention):
    """VA layer attention: PVT spatial-reduction attention that exposes its scores (Eq. 4).

    Computes ``A = Q Kᵀ/√d (+ residual)`` explicitly (the scores are stored for the following
    less-attention layers and the AR module), then ``softmax(A) V`` and the output projection.
    Parameter names follow PVT (``q``, ``kv``, ``sr``, ``norm``, ``proj``).

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads.
        sr_ratio (int): Key/value reduction ratio.
        qkv_bias (bool): Bias of q/kv.
        attn_drop (float): Dropout on the attention probabilities.
        proj_drop (float): Dropout after the projection.
    """

    def __init__(self, embed_dims, num_heads, sr_ratio=1, qkv_bias=True, attn_drop=0.,
                 proj_drop=0.):
        super().__init__(embed_dims, num_heads, sr_ratio)
        self.scale = (embed_dims // num_heads) ** -0.5
        self.q = Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = Linear(embed_dims, embed_dims * 2, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, hw_shape, residual=None, key_mask=None, need_scores=True,
                need_probs=True, factor_scores=False):
        """Args: x ``(B, N, C)``; residual ``(B, H, N, Nk)`` or :class:`FactoredScores` added to
        the scores (AR, Eq. 7); need_scores / need_probs: False when nobody reads this layer's
        scores / probabilities; factor_scores: return the scores as :class:`FactoredScores`
        where possible (their only reader is the next AR module).

        Returns:
            tuple: output ``(B, N, C)``, scores ``(B, H, N, Nk)`` (pre-softmax, unmasked; or
            factored), probabilities ``(B, H, N, Nk)`` and the key grid; scores and
            probabilities are None when not needed (then ``F.scaled_dot_product_attention``
            stores no map; with scores but no probabilities, inference runs
            :func:`scores_softmax_values`).
        """
        b, n, c = x.shape
        h = self.num_heads
        q = self.q(x).reshape(b, n, h, c // h).transpose(1, 2)
        kv_src, k_hw = self.reduce_tokens(x, hw_shape)
        k, v = project_heads(self.kv, kv_src, 2, h)
        # factors: no key mask to apply, and MAC counters trace the official explicit form
        factors_ok = key_mask is None and not torch.jit.is_tracing()
        if isinstance(residual, FactoredScores) and not (
                factors_ok and (factor_scores or not need_scores)):
            residual = residual.dense()
        if factors_ok and (isinstance(residual, FactoredScores)
                           or (residual is None and need_scores and factor_scores)):
            out, scores = self._attend_factors(q, k, v, residual, keep=need_scores)
            out = self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))
            return out, scores, None, k_hw
        # a residual that needs a gradient sends CPU SDPA to its explicit math path, which
        # stores the same maps as below: use SDPA where it runs a fused kernel
        fused = not need_scores and not (
            residual is not None and residual.requires_grad and torch.is_grad_enabled()
            and x.device.type == 'cpu')
        if fused:
            dropout = self.attn_drop.p if self.training else 0.
            if (residual is None and key_mask is None
                    and onednn_attention_applies(q, k, v, dropout)):
                out = onednn_attention(q, k, v, self.scale)
            else:
                mask = None if key_mask is None else ~key_mask  # SDPA: True = attend
                if residual is not None:
                    mask = residual.to(q.dtype)
                    if key_mask is not None:
                        mask = mask.masked_fill(key_mask, float('-inf'))
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
            out = self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))
            return out, None, None, k_hw
        if (not need_probs and key_mask is None and not torch.is_grad_enabled()
                and not (self.training and self.attn_drop.p > 0) and not torch.jit.is_tracing()):
            out, scores = scores_softmax_values(q, k, v, self.scale, residual)
            out = self.proj_drop(self.proj(out.view(b, n, c)))
            return out, scores, None, k_hw
        scores = (q * self.scale) @ k.transpose(-2, -1)
        if residual is not None:
            scores = scores + residual.to(scores.dtype)
        out, probs = self.attend(scores, v, key_mask)
        return out, scores, probs, k_hw

    def _attend_factors(self, q, k, v, residual, keep):
        """``softmax((q·scale) kᵀ + residual) v`` by fused SDPA on the concatenated factors
        ``[q·scale, R_q] · [k, R_k]ᵀ``; returns the output ``(B, H, N, d)`` and, if ``keep``,
        this layer's scores as :class:`FactoredScores`."""
        dropout = self.attn_drop.p if self.training else 0.
        if residual is None:
            if onednn_attention_applies(q, k, v, dropout):
                out = onednn_attention(q, k, v, self.scale)
            else:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=self.scale)
            return out, FactoredScores(q * self.scale, k) if keep else None
        b, h = q.shape[:2]
        query = torch.cat([q * self.scale, residual.query.to(q.dtype).expand(b, h, -1, -1)], -1)
        key = torch.cat([k, residual.key.to(k.dtype).expand(b, h, -1, -1)], -1)
        tail = residual.invariant_tail
        scores = FactoredScores(query, key, tail) if keep else None
        if tail:  # a per-row constant: softmax-invariant, not worth a feature of the kernel
            query, key = query[..., :-tail], key[..., :-tail]
        if onednn_attention_applies(query, key, v, dropout):  # any value width
            return onednn_attention(query, key, v, 1.), scores
        width = v.shape[-1]
        if q.device.type == 'cpu' and query.shape[-1] > width:
            # CPU's flash kernel needs one head size for q, k and v (else: the explicit math
            # path with full maps); zero value columns change nothing but the output's width
            v = F.pad(v, (0, query.shape[-1] - width))
        out = F.scaled_dot_product_attention(query, key, v, dropout_p=dropout, scale=1.)
        return out[..., :width], scores


class LessAttention(_ScoreAttention):
    """LA layer attention: no Q·K; the previous scores are re-parameterised (Eq. 5).

    ``A^l = Ψ(Θ(A^{l-1})ᵀ)ᵀ`` with ``Θ``, ``Ψ`` linear layers over the token axes: ``Θ``
    (``N_k×N_k``) mixes the key axis, ``Ψ`` (``N_q×N_q``) the query axis, shared by all heads
    and images (one matrix each, as printed). Then ``softmax(A^l) V^l``, the output projection
    and (in the block) the MLP are kept; ``V^l`` comes from this layer's own input, reduced like
    PVT's keys/values so it has ``N_k`` rows.

    ``Θ``/``Ψ`` start as the identity (``identity_init``): an LA layer then initially re-uses the
    inherited map exactly instead of scrambling it. ``Ψ``'s bias adds a per-row constant that
    a row softmax removes, so it is off by default (``psi_bias``).

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads.
        num_queries (int): ``N_q`` of the training grid (or window).
        num_keys (int): ``N_k``.
        sr_ratio (int): Value reduction ratio (as the stage's VA layers).
        qkv_bias (bool): Bias of the value projection.
        theta_bias (bool): Bias of ``Θ``.
        psi_bias (bool): Bias of ``Ψ``.
        identity_init (bool): Initialise ``Θ``/``Ψ`` to the identity (else trunc-normal).
        attn_drop (float): Dropout on the attention probabilities.
        proj_drop (float): Dropout after the projection.
    """

    def __init__(self, embed_dims, num_heads, num_queries, num_keys, sr_ratio=1, qkv_bias=True,
                 theta_bias=True, psi_bias=False, identity_init=True, attn_drop=0.,
                 proj_drop=0.):
        super().__init__(embed_dims, num_heads, sr_ratio)
        self.num_queries, self.num_keys = num_queries, num_keys
        self.identity_init = identity_init
        self.theta = Linear(num_keys, num_keys, bias=theta_bias)
        self.psi = Linear(num_queries, num_queries, bias=psi_bias)
        self.v = Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)
        self.reset_transforms()

    def reset_transforms(self):
        """Identity Θ/Ψ with zero biases (called again after a generic ``init_cfg``)."""
        if not self.identity_init:
            return
        with torch.no_grad():
            for lin in (self.theta, self.psi):
                lin.weight.copy_(torch.eye(lin.weight.shape[0]))
                if lin.bias is not None:
                    lin.bias.zero_()

    def transform(self, scores):
        """``Ψ(Θ(A)ᵀ)ᵀ`` on ``(..., N_q, N_k)`` scores."""
        nq, nk = scores.shape[-2:]
        if (nq, nk) != (self.num_queries, self.num_keys):
            raise ValueError(
                f'less attention holds Θ/Ψ for {self.num_queries} queries x {self.num_keys} '
                f'keys but got a {nq}x{nk} map: dense Θ/Ψ are tied to the training grid; use '
                "la_mode='window' (windows of the training grid) for other input sizes")
        return self.psi(self.theta(scores).transpose(-2, -1)).transpose(-2, -1)

    def forward(self, x, hw_shape, prev_scores, key_mask=None):
        """Args: x ``(B, N, C)``; prev_scores ``(B, H, N, N_k)`` of the previous layer.

        Returns:
            tuple: output, transformed scores ``A^l``, probabilities and the key grid.
        """
        b, n, c = x.shape
        h = self.num_heads
        scores = self.transform(prev_scores)
        v_src, k_hw = self.reduce_tokens(x, hw_shape)
        v = self.v(v_src).reshape(b, -1, h, c // h).transpose(1, 2)
        out, probs = self.attend(scores, v, key_mask)
        return out, scores, probs, k_hw
