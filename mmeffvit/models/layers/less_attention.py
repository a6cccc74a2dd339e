"""Vanilla and less attention of LaViT (Zhang et al., CVPR 2024, sec. 3.2, Eq. 4-5)."""
from typing import NamedTuple

import torch
import torch.nn as nn

from ... import ops
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
        out, probs = ops.softmax_values(scores, v, key_mask, self._dropout())
        out = out.transpose(1, 2).reshape(b, n, h * v.shape[-1])
        return self.proj_drop(self.proj(out)), probs

    def _dropout(self):
        return self.attn_drop.p if self.training else 0.


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
            :func:`mmeffvit.ops.scored_attention` by row blocks).
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
        if not need_scores:
            out = ops.attention(q, k, v, scale=self.scale, bias=residual, key_mask=key_mask,
                                dropout=self._dropout())
            out = self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))
            return out, None, None, k_hw
        out, scores, probs = ops.scored_attention(q, k, v, self.scale, residual, key_mask,
                                                  self._dropout(), need_probs)
        out = self.proj_drop(self.proj(out.reshape(b, n, c)))
        return out, scores, probs, k_hw

    def _attend_factors(self, q, k, v, residual, keep):
        """``softmax((q·scale) kᵀ + residual) v`` on the concatenated factors
        ``[q·scale, R_q] · [k, R_k]ᵀ`` (:func:`mmeffvit.ops.attention`); returns the output
        ``(B, H, N, d)`` and, if ``keep``, this layer's scores as :class:`FactoredScores`."""
        dropout = self._dropout()
        if residual is None:
            out = ops.attention(q, k, v, scale=self.scale, dropout=dropout)
            return out, FactoredScores(q * self.scale, k) if keep else None
        b, h = q.shape[:2]
        query = torch.cat([q * self.scale, residual.query.to(q.dtype).expand(b, h, -1, -1)], -1)
        key = torch.cat([k, residual.key.to(k.dtype).expand(b, h, -1, -1)], -1)
        tail = residual.invariant_tail
        scores = FactoredScores(query, key, tail) if keep else None
        if tail:  # a per-row constant: softmax-invariant, not worth a feature of the kernel
            query, key = query[..., :-tail], key[..., :-tail]
        return ops.attention(query, key, v, scale=1., dropout=dropout), scores


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
