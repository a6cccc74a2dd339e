"""Softmax attention over spatially reduced keys/values (PVT, Wang et al., ICCV 2021, sec. 3.3)."""
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from .norm import LayerNormFP32


class SpatialReductionAttention(BaseModule):
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
        self.sr_ratio = sr_ratio
        self.attn_drop = attn_drop
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = nn.Linear(embed_dims, embed_dims * 2, bias=qkv_bias)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(embed_dims, embed_dims, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = LayerNormFP32(embed_dims)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, hw_shape):
        """Args: x ``(B, H*W, C)``, hw_shape ``(H, W)``. Returns ``(B, H*W, C)``."""
        b, n, c = x.shape
        h = self.num_heads
        q = self.q(x).reshape(b, n, h, c // h).transpose(1, 2)
        if self.sr_ratio > 1:
            grid = self.sr(x.transpose(1, 2).reshape(b, c, *hw_shape))
            x = self.norm(grid.flatten(2).transpose(1, 2))
        k, v = self.kv(x).reshape(b, -1, 2, h, c // h).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0.)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))
