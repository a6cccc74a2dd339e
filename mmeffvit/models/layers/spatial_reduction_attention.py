"""Softmax attention over spatially reduced keys/values (PVT, Wang et al., ICCV 2021, sec. 3.3)."""
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from ...utils import map_to_tokens, tokens_to_map
from .linear import Linear, project_heads
from .norm import LayerNormFP32


class SpatialReductionMixin:
    """PVT's key/value source (sec. 3.3): the token grid reduced by a ``k = s = sr_ratio`` conv
    ``sr`` and a LayerNorm ``norm`` (none of it when ``sr_ratio == 1``).

    A mixin of the attention modules (SRA, focused linear attention, LaViT's VA/LA layers)
    rather than a submodule, so that the weights keep the official names ``attn.sr`` and
    ``attn.norm``. Call :meth:`build_spatial_reduction` where the official module builds them
    (the registration order is the state-dict order).
    """

    def build_spatial_reduction(self, embed_dims, sr_ratio):
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(embed_dims, embed_dims, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = LayerNormFP32(embed_dims)

    def reduce_tokens(self, x, hw_shape):
        """Tokens ``(B, H*W, C)`` → reduced tokens ``(B, h*w, C)`` and their grid ``(h, w)``."""
        if self.sr_ratio <= 1:
            return x, tuple(hw_shape)
        tokens, hw = map_to_tokens(self.sr(tokens_to_map(x, hw_shape)))
        return self.norm(tokens), hw


class SpatialReductionAttention(SpatialReductionMixin, BaseModule):
    """PVT's spatial-reduction attention (SRA), the ``'S'`` block type of FLatten-PVT.

    Keys and values come from the token grid reduced by a stride-``sr_ratio`` conv and a
    LayerNorm; attention is the usual scaled softmax (``F.scaled_dot_product_attention``).
    Parameter names (``q``, ``kv``, ``sr``, ``norm``, ``proj``) follow the official PVT code so
    checkpoints load unchanged.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads.
        sr_ratio (int): Reduction ratio of the key/value grid (1 = none).
        qkv_bias (bool): Bias of the q/kv projections.
        attn_drop (float): Dropout on attention weights.
        proj_drop (float): Dropout after the output projection.
        init_cfg (dict, optional): Initialisation config.
    """

    def __init__(self, embed_dims, num_heads, sr_ratio=1, qkv_bias=True, attn_drop=0.,
                 proj_drop=0., init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims {embed_dims} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.attn_drop = attn_drop
        self.q = Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = Linear(embed_dims, embed_dims * 2, bias=qkv_bias)
        self.build_spatial_reduction(embed_dims, sr_ratio)
        self.proj = Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, hw_shape):
        """Args: x ``(B, H*W, C)``, hw_shape ``(H, W)``. Returns ``(B, H*W, C)``."""
        b, n, c = x.shape
        h = self.num_heads
        q = self.q(x).reshape(b, n, h, c // h).transpose(1, 2)
        k, v = project_heads(self.kv, self.reduce_tokens(x, hw_shape)[0], 2, h)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0.)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))
