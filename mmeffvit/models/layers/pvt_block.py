"""The PVT block with FLatten's attention choice (PVT v1 / v2 layouts; FLatten, ICCV 2023)."""
import torch.nn as nn
from timm.layers import DropPath

from ... import ops
from .depthwise_conv import DepthwiseConv2d
from .focused_linear_attention import FocusedLinearAttention
from .linear import Linear, Mlp, _without_hooks, gelu_linear, mlp_residual
from .norm import LayerNormFP32
from .spatial_reduction_attention import SpatialReductionAttention


class DWConv(nn.Module):
    """Depthwise 3×3 conv on the token grid; the wrapper keeps the official ``dwconv.dwconv``."""

    def __init__(self, channels):
        super().__init__()
        self.dwconv = DepthwiseConv2d(channels, 3)

    def forward(self, x, hw_shape):
        return self.dwconv(x, hw_shape)


class ConvMlp(nn.Module):
    """PVT v2 feed-forward: ``fc1 → depthwise 3×3 conv → GELU → fc2`` (PVT v2, sec. 3.3).

    The depthwise conv gives the MLP the zero-padding position cue that replaces PVT v1's
    absolute position embeddings. timm's ``MlpWithDepthwiseConv`` computes the same but names
    the conv ``dwconv`` instead of the official ``dwconv.dwconv``.
    """

    def __init__(self, in_features, hidden_features, drop=0.):
        super().__init__()
        self.fc1 = Linear(in_features, hidden_features)
        self.dwconv = DWConv(hidden_features)
        self.act = nn.GELU()
        self.fc2 = Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x, hw_shape):
        exact_gelu = type(self.act) is nn.GELU and self.act.approximate == 'none'
        x = self.fc1(x)
        conv = self.dwconv.dwconv
        if exact_gelu and not self.training and _without_hooks(self.dwconv, conv):
            # conv and GELU one call: one pass where the kernels allow (ops.depthwise_conv)
            x = ops.depthwise_conv(x, conv.weight, conv.bias, hw_shape, conv.padding, act='gelu')
            return self.drop(self.fc2(x))
        x = self.dwconv(x, hw_shape)
        if exact_gelu and (self.drop.p == 0 or not self.training):
            # GELU and fc2 one Function in training; x, the conv's output, is held by nobody else
            return self.drop(gelu_linear(x, self.fc2, owned=True))
        return self.drop(self.fc2(self.drop(self.act(x))))


class FLattenPVTBlock(nn.Module):
    """Pre-norm PVT block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``.

    ``attn_type='L'`` uses :class:`FocusedLinearAttention`, ``'S'`` PVT's softmax
    :class:`SpatialReductionAttention` (the official ``attn_type`` letter per stage). The MLP is
    PVT v1's (timm ``Mlp``) or, with ``conv_mlp``, PVT v2's :class:`ConvMlp`. Parameter names
    are the official ones of both FLatten-PVT codes.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads.
        mlp_ratio (float): Hidden width of the MLP over C.
        attn_type (str): ``'L'`` or ``'S'``.
        pe_size (tuple[int, int], optional): Key grid of the ``'L'`` positional encoding.
        sr_ratio (int): Spatial reduction of keys/values.
        qkv_bias (bool): Bias of the q/kv projections.
        focusing_factor (float): Focusing power p (``'L'``).
        kernel_size (int): Kernel of the rank-restoring depthwise conv (``'L'``).
        drop_rate (float): Dropout after the projections and in the MLP.
        drop_path (float): Stochastic depth of both residual branches.
        norm_eps (float): Epsilon of both LayerNorms.
        conv_mlp (bool): PVT v2's MLP with a depthwise conv.

    Example:
        >>> import torch
        >>> block = FLattenPVTBlock(64, 2, 4, pe_size=(7, 7), conv_mlp=True)
        >>> block(torch.rand(1, 9 * 13, 64), (9, 13)).shape
        torch.Size([1, 117, 64])
    """

    def __init__(self, embed_dims, num_heads, mlp_ratio, attn_type='L', pe_size=None, sr_ratio=1,
                 qkv_bias=True, focusing_factor=3, kernel_size=5, drop_rate=0., drop_path=0.,
                 norm_eps=1e-6, conv_mlp=False):
        super().__init__()
        self.norm1 = LayerNormFP32(embed_dims, eps=norm_eps)
        if attn_type == 'L':
            self.attn = FocusedLinearAttention(
                embed_dims, num_heads, pe_size=pe_size, qkv_bias=qkv_bias,
                focusing_factor=focusing_factor, kernel_size=kernel_size, sr_ratio=sr_ratio,
                proj_drop=drop_rate)
        elif attn_type == 'S':
            self.attn = SpatialReductionAttention(
                embed_dims, num_heads, sr_ratio=sr_ratio, qkv_bias=qkv_bias, proj_drop=drop_rate)
        else:
            raise ValueError(f"attn_type must be 'L' or 'S', got {attn_type!r}")
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = LayerNormFP32(embed_dims, eps=norm_eps)
        self.conv_mlp = conv_mlp
        hidden = int(embed_dims * mlp_ratio)
        self.mlp = (ConvMlp(embed_dims, hidden, drop=drop_rate) if conv_mlp
                    else Mlp(embed_dims, hidden, drop=drop_rate))

    def forward(self, x, hw_shape):
        x = x + self.drop_path(self.attn(self.norm1(x), hw_shape))
        if not self.conv_mlp:
            return mlp_residual(x, self.norm2, self.mlp, self.drop_path, owned=True)
        return x + self.drop_path(self.mlp(self.norm2(x), hw_shape))
