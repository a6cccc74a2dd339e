"""Focused linear attention (FLatten Transformer, Han et al., ICCV 2023, sec. 4)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from ... import ops
from ...utils import TokenGridResizeCache
from .depthwise_conv import DepthwiseConv2d
from .linear import Linear, _without_hooks
from .spatial_reduction_attention import SpatialReductionMixin


def _check_tokens(name, tokens, grid, channels, batch=None, grid_name='hw_shape'):
    """Raise a ValueError naming the mismatch unless ``tokens`` is ``(B, h*w, channels)``."""
    shape = tuple(getattr(tokens, 'shape', ()))
    if len(grid) != 2 or not all(side > 0 for side in grid):
        raise ValueError(f'{grid_name} must be (H, W) with positive sides, got {tuple(grid)}')
    if len(shape) != 3:
        raise ValueError(f'{name} must be a (B, tokens, C) tensor, got shape {shape}')
    if shape[1] != grid[0] * grid[1]:
        raise ValueError(f'{name} has {shape[1]} tokens, {grid_name} {tuple(grid)} has '
                         f'{grid[0] * grid[1]}')
    if shape[2] != channels:
        raise ValueError(f'{name} has {shape[2]} channels, the module embed_dims={channels}')
    if batch is not None and shape[0] != batch:
        raise ValueError(f'{name} has batch size {shape[0]}, q has {batch}')


class FocusedLinearAttention(SpatialReductionMixin, BaseModule):
    """Focused linear attention with depthwise-conv rank restoration (FLatten, sec. 4).

    ``O = φ_p(Q) (φ_p(K)^T V) / normaliser + DWC(V)`` followed by the output projection. The
    depthwise K×K conv on V restores the rank lost by linear attention (sec. 4.2, eq. 9); as in the
    official code one d-channel kernel set is shared by all heads. A learnable positional encoding
    is added to K before the kernel. The official module stores it for the 224² training grid only
    and fails at any other size; here it is resized (bicubic by default) to the runtime key grid,
    which is exact when the sizes match.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads h; C must be divisible by h.
        pe_size (tuple[int, int] | None): Key grid ``(H, W)`` for which the positional encoding is
            stored (the pre-training resolution of the stage). None disables it.
        qkv_bias (bool): Bias of the q/k/v projections.
        focusing_factor (float): The power p of the focusing function (3 in all released models).
        kernel_size (int): Size of the depthwise conv on V (5 in all released models).
        sr_ratio (int): Spatial reduction of keys/values as PVT (1 = none, the released setting).
            With sr > 1 the DWC runs on the reduced grid and is upsampled bilinearly to the query
            grid (the official code interpolates the flattened 1-D token sequence instead, which
            mixes rows; the 2-D resize is the choice made here).
        qkv_layout (str | None): ``'q_kv'`` (separate ``q`` and ``kv`` linears, PVT naming),
            ``'qkv'`` (one fused ``qkv`` linear, Swin naming), or None: no projections and no
            output ``proj`` at all, for callers that project themselves and call
            :meth:`attend` (CSWin keeps ``qkv`` and ``proj`` in its block).
        proj_drop (float): Dropout after the output projection.
        pe_interpolation (str): Mode used to resize the positional encoding.
        init_cfg (dict, optional): Initialisation config.

    Standalone use (a token mixer for your own model; see also the README):

    * :meth:`forward` ``(x, hw_shape)``: ``x`` is ``(B, H*W, C)`` tokens of an ``H×W`` map in
      row-major order (``feature_map.flatten(2).transpose(1, 2)``), ``C = embed_dims``; returns
      ``(B, H*W, C)``. Cost and memory are linear in ``H*W``; any ``H``, ``W`` (the positional
      encoding is resized, the DWC pads).
    * :meth:`attend` ``(q, k, v, hw_shape[, kv_hw])``: the attention and its DWC term alone, on
      tokens the caller projected (use ``qkv_layout=None`` to create no projection at all).
    * dtypes: float32, float64, bfloat16 or float16, the module's parameters in the same dtype as
      the inputs, or fp32 parameters under ``torch.autocast``. The focusing function and the
      attention sums always run in fp32 (fp64 for fp64 inputs); the output has the dtype of
      ``q`` (of ``x``).
    * A ``ValueError`` names the mismatch for tensors that are not ``(B, tokens, C)``, token
      counts that differ from the grid, channels other than ``embed_dims`` and batch sizes that
      differ between q, k and v.

    Example:
        >>> attn = FocusedLinearAttention(64, 2, pe_size=(14, 14), qkv_layout='qkv')
        >>> feature_map = torch.randn(2, 64, 20, 30)              # (B, C, H, W)
        >>> tokens = feature_map.flatten(2).transpose(1, 2)       # (B, H*W, C)
        >>> attn(tokens, (20, 30)).shape
        torch.Size([2, 600, 64])
    """

    def __init__(self,
                 embed_dims,
                 num_heads,
                 pe_size=None,
                 qkv_bias=True,
                 focusing_factor=3,
                 kernel_size=5,
                 sr_ratio=1,
                 qkv_layout='q_kv',
                 proj_drop=0.,
                 pe_interpolation='bicubic',
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims {embed_dims} is not divisible by num_heads {num_heads}')
        if qkv_layout not in ('q_kv', 'qkv', None):
            raise ValueError(f"qkv_layout must be 'q_kv', 'qkv' or None, got {qkv_layout!r}")
        if qkv_layout != 'q_kv' and sr_ratio > 1:
            raise ValueError("sr_ratio > 1 needs qkv_layout='q_kv' (keys come from reduced tokens)")
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.focusing_factor = focusing_factor
        self.qkv_layout = qkv_layout
        self.pe_interpolation = pe_interpolation

        if qkv_layout == 'qkv':
            self.qkv = Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        elif qkv_layout == 'q_kv':
            self.q = Linear(embed_dims, embed_dims, bias=qkv_bias)
            self.kv = Linear(embed_dims, embed_dims * 2, bias=qkv_bias)
        self.build_spatial_reduction(embed_dims, sr_ratio)
        if qkv_layout is not None:
            self.proj = Linear(embed_dims, embed_dims)
            self.proj_drop = nn.Dropout(proj_drop)
        self.dwc = DepthwiseConv2d(self.head_dims, kernel_size)
        # zero init: softplus(0) = ln 2, and an all-zero positional encoding (official init)
        self.scale = nn.Parameter(torch.zeros(1, 1, embed_dims))
        if pe_size is not None:
            self.pe_size = tuple(pe_size)
            self.positional_encoding = nn.Parameter(
                torch.zeros(1, self.pe_size[0] * self.pe_size[1], embed_dims))
        else:
            self.pe_size = None
            self.register_parameter('positional_encoding', None)
        self._pe_resized = TokenGridResizeCache()

    def _project(self, x, hw_shape):
        """q ``(B, N, C)`` and k, v ``(B, n, C)`` with the key grid ``(h, w)``."""
        if self.qkv_layout == 'qkv':
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            return q, k, v, hw_shape
        q = self.q(x)
        x, kv_hw = self.reduce_tokens(x, hw_shape)
        k, v = self.kv(x).chunk(2, dim=-1)
        return q, k, v, kv_hw

    def forward(self, x, hw_shape):
        """Args: x ``(B, H*W, C)`` tokens, hw_shape ``(H, W)``. Returns ``(B, H*W, C)``."""
        if self.qkv_layout is None:
            raise RuntimeError("qkv_layout=None: project q, k, v yourself and call attend()")
        _check_tokens('x', x, hw_shape, self.embed_dims)
        if self._plain_qkv():
            dwc = self.dwc
            out = ops.focused_qkv_attention(
                x, self.qkv.weight, self.qkv.bias, self.scale, dwc.weight, dwc.bias,
                tuple(hw_shape), self.num_heads, self.focusing_factor,
                pe=self._resized_encoding(hw_shape), padding=dwc.padding)
            return self.proj_drop(self.proj(out))
        q, k, v, kv_hw = self._project(x, hw_shape)
        return self.proj_drop(self.proj(self.attend(q, k, v, hw_shape, kv_hw)))

    def _plain_qkv(self):
        """A fused ``qkv`` linear and a plain stride-1 DWC that nothing hooks: the module's
        attention is :func:`mmeffvit.ops.focused_qkv_attention` of their weights."""
        return (self.qkv_layout == 'qkv' and type(self.qkv) in (Linear, nn.Linear)
                and type(self.dwc) is DepthwiseConv2d and self.dwc.stride == (1, 1)
                and self.dwc.dilation == (1, 1) and _without_hooks(self.qkv, self.dwc))

    def _resized_encoding(self, hw_shape):
        """The positional encoding for a key grid ``hw_shape`` (None without one)."""
        if self.positional_encoding is None:
            return None
        return self._pe_resized(self.positional_encoding, self.pe_size, tuple(hw_shape),
                                self.pe_interpolation)

    def attend(self, q, k, v, hw_shape, kv_hw=None):
        """Focused linear attention plus DWC on projected tokens, before any output projection.

        Args:
            q (Tensor): ``(B, H*W, C)`` queries on the grid ``hw_shape``.
            k, v (Tensor): ``(B, h*w, C)`` keys and values on the grid ``kv_hw``
                (default ``hw_shape``); the positional encoding is added to ``k`` here.

        Returns:
            Tensor: ``(B, H*W, C)`` in the dtype of ``q``.
        """
        kv_hw = tuple(hw_shape if kv_hw is None else kv_hw)
        kv_name = 'hw_shape' if kv_hw == tuple(hw_shape) else 'kv_hw'
        for name, tokens, grid, grid_name in (('q', q, hw_shape, 'hw_shape'),
                                              ('k', k, kv_hw, kv_name), ('v', v, kv_hw, kv_name)):
            _check_tokens(name, tokens, grid, self.embed_dims, q.shape[0], grid_name)
        b, _, c = q.shape
        if self.positional_encoding is not None:
            k = k + self._resized_encoding(kv_hw)

        # rank restoration: depthwise conv on V, one kernel set shared by every head. Head ``i``
        # owns channels ``i·d … i·d + d - 1``, so this is one depthwise conv over the whole
        # channels-last view of v with the d-channel kernel set repeated h times (no copies)
        dwc = self.dwc(v.transpose(1, 2).reshape(b, c, *kv_hw), repeats=self.num_heads)
        if kv_hw != tuple(hw_shape):
            dwc = F.interpolate(dwc, size=tuple(hw_shape), mode='bilinear', align_corners=False)

        # the focusing power and the attention sums stay in fp32 under autocast; one fused
        # operator (mmeffvit.ops) or its PyTorch reference, the DWC term added to its output
        with torch.autocast(device_type=q.device.type, enabled=False):
            return ops.focused_linear_attention(q, k, v, self.scale, self.num_heads,
                                                self.focusing_factor,
                                                residual=dwc.flatten(2).transpose(1, 2))
