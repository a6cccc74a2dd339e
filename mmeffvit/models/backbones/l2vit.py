"""L²ViT: local window attention + clamped linear global attention (Zheng, arXiv 2501.16182)."""
import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from timm.layers import DropPath

from ...registry import register_model
from ...utils import map_to_tokens, tokens_to_contiguous_map, tokens_to_map
from ..layers import DepthwiseConv2d, LayerNormFP32, PatchEmbed, WindowMSA
from ..layers.clamped_linear_attention import clamped_linear_attention
from ..layers.linear import Linear, Mlp, mlp_residual, project_heads
from ..layers.window import pad_to_windows, window_partition, window_reverse
from .base import EffBackbone, resolve_arch


class CPE(nn.Module):
    """Conditional position encoding: ``x + DWConv3×3(x)`` on the token grid (sec. 3.3)."""

    def __init__(self, dims, kernel_size=3):
        super().__init__()
        self.proj = DepthwiseConv2d(dims, kernel_size)

    def forward(self, x, hw_shape):
        return x + self.proj(x, hw_shape)


class LinearAttention(nn.Module):
    """Global linear attention of L²ViT (sec. 3.2, the "enhanced linear attention").

    ReLU kernel on q and k, learnable per-head temperature on the ``KᵀV`` state (initialised to
    ``d^-1/2``), normaliser clamped at ``min_denominator``; see :func:`clamped_linear_attention`,
    which keeps the sums in fp32 under autocast.
    """

    def __init__(self, dims, num_heads, qkv_bias=True, min_denominator=100.):
        super().__init__()
        self.num_heads = num_heads
        self.min_denominator = min_denominator
        self.temperature = nn.Parameter(torch.full((num_heads, 1, 1), (dims // num_heads)**-0.5))
        self.qkv = Linear(dims, dims * 3, bias=qkv_bias)
        self.proj = Linear(dims, dims)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = project_heads(self.qkv, x, 3, self.num_heads)
        out = clamped_linear_attention(q, k, v, self.temperature, self.min_denominator)
        return self.proj(out.to(x.dtype).transpose(1, 2).reshape(b, n, c))


class LCM(nn.Module):
    """Local concentration module: DWConv7×7 → GELU → BN → DWConv7×7 (sec. 3.3)."""

    def __init__(self, dims, kernel_size=7, norm_cfg=dict(type='BN')):
        super().__init__()
        self.conv1 = DepthwiseConv2d(dims, kernel_size)
        self.act = nn.GELU()
        self.bn = build_norm_layer(norm_cfg, dims)[1]
        self.conv2 = DepthwiseConv2d(dims, kernel_size)

    def forward(self, x, hw_shape):
        # channels-last throughout: the token view in, GELU/BN keep the layout, tokens out
        x = self.conv2(self.bn(self.act(self.conv1(tokens_to_map(x, hw_shape)))))
        return map_to_tokens(x)[0]


class LWABlock(nn.Module):
    """Local window attention block (sec. 3.1): ``CPE → W-MSA → CPE → MLP``.

    The windows are never shifted and padded positions are not masked: as in the official code,
    the zero tokens appended to reach a multiple of the window size are ordinary keys.
    """

    def __init__(self, dims, num_heads, window_size=7, mlp_ratio=4., qkv_bias=True,
                 drop_path=0.):
        super().__init__()
        self.window_size = window_size
        self.cpe = nn.ModuleList([CPE(dims), CPE(dims)])
        self.norm1 = LayerNormFP32(dims)
        # no relative position bias (position comes from the CPEs): no window-bound parameter
        self.attn = WindowMSA(dims, num_heads, qkv_bias=qkv_bias)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = LayerNormFP32(dims)
        self.mlp = Mlp(dims, int(dims * mlp_ratio))

    def forward(self, x, hw_shape):
        h, w = hw_shape
        b, n, c = x.shape
        ws = self.window_size
        shortcut = self.cpe[0](x, hw_shape)
        y = pad_to_windows(self.norm1(shortcut).reshape(b, h, w, c), ws)
        hp, wp = y.shape[1], y.shape[2]
        y = window_reverse(self.attn(window_partition(y, ws)), ws, hp, wp)
        y = y[:, :h, :w].reshape(b, n, c)
        x = self.cpe[1](shortcut + self.drop_path(y), hw_shape)
        return mlp_residual(x, self.norm2, self.mlp, self.drop_path, owned=True)


class LGABlock(nn.Module):
    """Linear global attention block with the LCM (sec. 3.2-3.3): ``CPE → LA → LCM → MLP``."""

    def __init__(self, dims, num_heads, mlp_ratio=4., qkv_bias=True, drop_path=0.,
                 min_denominator=100., norm_cfg=dict(type='BN')):
        super().__init__()
        self.cpe = nn.ModuleList([CPE(dims)])
        self.norm1 = LayerNormFP32(dims)
        self.attn = LinearAttention(dims, num_heads, qkv_bias, min_denominator)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm3 = LayerNormFP32(dims)
        self.local_mp = LCM(dims, norm_cfg=norm_cfg)
        self.norm2 = LayerNormFP32(dims)
        self.mlp = Mlp(dims, int(dims * mlp_ratio))

    def forward(self, x, hw_shape):
        x = self.cpe[0](x, hw_shape)
        x = x + self.drop_path(self.attn(self.norm1(x)))
        x = x + self.drop_path(self.local_mp(self.norm3(x), hw_shape))
        return mlp_residual(x, self.norm2, self.mlp, self.drop_path, owned=True)


class ConvStem(nn.Module):
    """Two-layer conv stem: Conv3×3/2 → BN → ReLU → Conv3×3/2 → BN (official ``ConvStem``)."""

    def __init__(self, in_channels, dims, norm_cfg=dict(type='BN')):
        super().__init__()
        self.proj = nn.Sequential(
            nn.Conv2d(in_channels, dims // 2, 3, stride=2, padding=1),
            build_norm_layer(norm_cfg, dims // 2)[1],
            nn.ReLU(),
            nn.Conv2d(dims // 2, dims, 3, stride=2, padding=1),
            build_norm_layer(norm_cfg, dims)[1])

    def forward(self, x):
        return self.proj(x)


@register_model
class L2ViT(EffBackbone):
    """L²ViT backbone (Zheng, "The Linear Attention Resurrection in Vision Transformer").

    Four stages at strides 4/8/16/32 (conv stem, then LayerNorm-before-conv 2×2 downsampling);
    each stage alternates a local window attention block (:class:`LWABlock`, window 7, two CPEs)
    and a linear global attention block (:class:`LGABlock`, ReLU-kernel linear attention with a
    per-head temperature and the clamped normaliser, followed by the local concentration module,
    sec. 3). For dense prediction a LayerNorm ``norm{i}`` is applied to every output stage, as in
    the official detection/segmentation backbone. Names follow the official code
    (``downsample_layers.*``, ``stages.{i}.{j}.*``, ``norm{i}``), so the released ImageNet files
    (weights under ``'model'``) load through ``init_cfg=dict(type='Pretrained', ...)``; their
    classifier ``norm``/``head`` are dropped and ``norm{i}`` start fresh. ``final_norm=True``
    builds that classifier ``norm`` instead of the ``norm{i}`` (classification, see
    :class:`EffBackbone`).

    Deviations, all documented options: ``window_size`` is honoured (the official det/seg code
    silently builds 7-windows whatever it is given; 7 is the default); ``norm_cfg`` selects the
    BatchNorm of the stem and of every LCM (official: plain BN, trained at 2 images/GPU).

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'`` (aliases ``'t'``, ``'s'``, ``'b'``)
            or a dict with ``embed_dims``, ``depths``, ``num_heads``.
        in_channels (int): Input channels.
        window_size (int): Window of the local attention blocks.
        mlp_ratio (float): Hidden width ratio of every MLP.
        qkv_bias (bool): Bias of the q/k/v projections.
        min_denominator (float): Clamp of the linear attention's normaliser (100 as released).
        drop_path_rate (float): Stochastic depth, increasing linearly over all blocks.
        out_indices (Sequence[int]): Stages to output (0-based).
        final_norm (bool): Classification: the official final ``norm`` on the last stage
            instead of the out-norms (:class:`EffBackbone`).
        norm_cfg (dict): Norm of the stem and of the LCMs (``dict(type='BN')`` as released).
        frozen_stages (int): See :class:`EffBackbone`.
        norm_eval (bool): See :class:`EffBackbone`.
        init_cfg (dict | list, optional): Initialisation.

    Example:
        >>> import torch
        >>> from mmeffvit.models import L2ViT
        >>> model = L2ViT(arch='tiny').eval()
        >>> outs = model(torch.rand(1, 3, 333, 517))
        >>> [tuple(o.shape) for o in outs]
        [(1, 96, 84, 130), (1, 192, 42, 65), (1, 384, 21, 33), (1, 768, 11, 17)]
    """

    arch_settings = {
        'tiny': dict(embed_dims=[96, 192, 384, 768], depths=[2, 2, 6, 2],
                     num_heads=[3, 6, 12, 24]),
        'small': dict(embed_dims=[96, 192, 384, 768], depths=[2, 2, 18, 2],
                      num_heads=[3, 6, 12, 24]),
        'base': dict(embed_dims=[128, 256, 512, 1024], depths=[2, 2, 18, 2],
                     num_heads=[4, 8, 16, 32]),
    }
    arch_aliases = {'t': 'tiny', 's': 'small', 'b': 'base', 'l2vit_tiny': 'tiny',
                    'l2vit_small': 'small', 'l2vit_base': 'base'}
    # classifier norm/head dropped; the per-stage norm{i} start fresh
    ckpt_strip_prefixes = ('module.', 'backbone.')
    ckpt_drop_prefixes = ('head.', 'norm.')
    final_norm_cfg = dict(eps=1e-5)  # official nn.LayerNorm (build_norm 'LN')
    default_init_cfg = [
        dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
        dict(type='Kaiming', layer='Conv2d', mode='fan_out', nonlinearity='relu', bias=0.,
             distribution='normal'),
        dict(type='Constant', layer=['LayerNorm', '_BatchNorm'], val=1., bias=0.),
    ]

    def __init__(self,
                 arch='tiny',
                 in_channels=3,
                 window_size=7,
                 mlp_ratio=4.,
                 qkv_bias=True,
                 min_denominator=100.,
                 drop_path_rate=0.1,
                 out_indices=(0, 1, 2, 3),
                 final_norm=False,
                 norm_cfg=dict(type='BN'),
                 frozen_stages=-1,
                 norm_eval=False,
                 init_cfg=None):
        super().__init__(frozen_stages=frozen_stages, norm_eval=norm_eval, init_cfg=init_cfg,
                         final_norm=final_norm)
        arch = resolve_arch(arch, self.arch_settings, self.arch_aliases,
                            required=('embed_dims', 'depths', 'num_heads'))
        dims, depths, heads = arch['embed_dims'], arch['depths'], arch['num_heads']
        if not len(dims) == len(depths) == len(heads) == 4:
            raise ValueError('arch embed_dims, depths and num_heads need 4 entries each')
        if any(d % h for d, h in zip(dims, heads)):
            raise ValueError(f'embed_dims {dims} must be divisible by num_heads {heads}')
        if not isinstance(window_size, int) or window_size < 1:
            raise ValueError(f'window_size must be a positive int, got {window_size!r}')
        out_indices = tuple(out_indices)
        if not out_indices or any(not 0 <= i < 4 for i in out_indices):
            raise ValueError(f'out_indices must be a non-empty subset of 0..3, got {out_indices}')
        self.arch = arch
        self.embed_dims = list(dims)
        self.depths = list(depths)
        self.out_indices = out_indices
        dpr = torch.linspace(0, drop_path_rate, sum(depths), device='cpu').tolist()

        # stem: conv stem, LayerNorm after; downsampling: LayerNorm before a 2×2/2 conv; the
        # input is zero-padded right/bottom to a multiple of the stride first (official)
        self.downsample_layers = nn.ModuleList(
            [PatchEmbed(in_channels, dims[0], 4, proj=ConvStem(in_channels, dims[0], norm_cfg))]
            + [PatchEmbed(dims[i - 1], dims[i], 2, norm='before') for i in range(1, 4)])
        self.stages = nn.ModuleList()
        for i in range(4):
            start = sum(depths[:i])
            # even positions: local windows; odd positions: linear global + LCM (official)
            self.stages.append(nn.ModuleList([
                LWABlock(dims[i], heads[i], window_size, mlp_ratio, qkv_bias, dpr[start + j])
                if j % 2 == 0 else
                LGABlock(dims[i], heads[i], mlp_ratio, qkv_bias, dpr[start + j],
                         min_denominator, norm_cfg)
                for j in range(depths[i])]))
        for i in out_indices:
            self.add_module(f'norm{i}', self.out_norm_layer(dims[i]))
        self.add_final_norm(dims[-1])
        self._freeze_stages()

    def stage_modules(self, index):
        if index < 0:
            return [self.downsample_layers[0]]
        mods = [self.stages[index], getattr(self, f'norm{index}', None)]
        if index > 0:
            mods.append(self.downsample_layers[index])
        return mods

    def forward(self, x):
        outs = []
        hw = None
        for i in range(4):
            x, hw = self.downsample_layers[i](x, hw)
            for blk in self.stages[i]:
                x = blk(x, hw)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(x)
                outs.append(tokens_to_contiguous_map(out, hw))
        return tuple(outs)
