"""FLatten-Swin: Swin Transformer with focused linear attention (FLatten, ICCV 2023, sec. 5.1)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.model.weight_init import trunc_normal_
from timm.layers import DropPath

from ...registry import register_model
from ...utils import tokens_to_contiguous_map
from ..layers import FocusedLinearAttention, LayerNormFP32, PatchEmbed, WindowMSA
from ..layers.linear import Linear, Mlp, _without_hooks, mlp_residual, split_owned_heads
from ..layers.relative_position import cached_shifted_window_mask
from ..layers.window import (pad_to_windows, window_order, window_order_inverse,
                             window_order_unpadded)
from .base import EffBackbone, check_stage_args, resolve_arch


class FLattenSwinBlock(nn.Module):
    """Pre-norm Swin block whose attention is focused linear (``'L'``) or windowed (``'S'``).

    ``'L'``: :class:`FocusedLinearAttention` over the **whole** stage map (the official models
    use a window equal to the 224² (384²) stage map, i.e. global attention without shift); its
    positional encoding is stored for ``pe_size`` and resized to the runtime map.

    ``'S'``: :class:`WindowMSA` on ``window_size`` windows, cyclically shifted by ``shift_size``
    (odd blocks). The normalised map is zero-padded at the bottom/right to window multiples, the
    shift masks are built for the padded size at run time, and the result is cropped back
    (mmdet's Swin); only the real tokens go through ``qkv`` and ``proj`` (a padding token's
    ``qkv`` is the bias). With ``official_window_rule`` a map whose shorter side is
    ``≤ window_size`` uses one window of that side and no shift, as the official (fixed-size)
    code decides at construction.
    """

    def __init__(self, embed_dims, num_heads, attn_type='L', window_size=7, shift_size=0,
                 pe_size=None, mlp_ratio=4., qkv_bias=True, focusing_factor=3, kernel_size=5,
                 drop_rate=0., attn_drop_rate=0., drop_path=0., official_window_rule=False):
        super().__init__()
        if attn_type not in ('L', 'S'):
            raise ValueError(f"attn_type must be 'L' or 'S', got {attn_type!r}")
        if not 0 <= shift_size < window_size:
            raise ValueError(f'shift_size {shift_size} must lie in [0, window_size={window_size})')
        self.attn_type = attn_type
        self.window_size = window_size
        self.shift_size = shift_size
        self.official_window_rule = official_window_rule
        self.norm1 = LayerNormFP32(embed_dims)
        if attn_type == 'L':
            self.attn = FocusedLinearAttention(
                embed_dims, num_heads, pe_size=pe_size, qkv_bias=qkv_bias,
                focusing_factor=focusing_factor, kernel_size=kernel_size, qkv_layout='qkv',
                proj_drop=drop_rate)
        else:
            self.attn = WindowMSA(embed_dims, num_heads, window_size, qkv_bias=qkv_bias,
                                  attn_drop=attn_drop_rate, proj_drop=drop_rate)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = LayerNormFP32(embed_dims)
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop=drop_rate)

    def window_and_shift(self, hw_shape):
        """The (window, shift) used on a map of ``hw_shape``."""
        if self.official_window_rule and min(hw_shape) <= self.window_size:
            return min(hw_shape), 0
        return self.window_size, self.shift_size

    def shifted_window_attention(self, x, hw_shape):
        b, n, c = x.shape
        height, width = hw_shape
        window, shift = self.window_and_shift(hw_shape)
        hp, wp = height + -height % window, width + -width % window
        mask = cached_shifted_window_mask(hp, wp, window, shift, x.device) if shift else None
        # roll by -shift and window partition as one gather, the reverse (window reverse, roll
        # back, crop) as another, with indices cached per geometry (Swin's shift, sec. 3.2)
        back = window_order_inverse(height, width, hp, wp, window, shift, x.device)
        if hp * wp > n and _without_hooks(self.attn):  # hooks see the module's own call
            windows = self._padded_qkv_windows(x, hw_shape, window, shift)
            q, k, v = split_owned_heads(windows.view(-1, window * window, 3 * c), 3,
                                        self.attn.num_heads)
            out = self.attn.attend(q, k, v, window, mask).reshape(b, -1, c).index_select(1, back)
            # proj after the crop: the padding's outputs are dropped unprojected
            return self.attn.proj_drop(self.attn.proj(out))
        x = pad_to_windows(x.view(b, height, width, c), window).reshape(b, hp * wp, c)
        windows = x.index_select(1, window_order(hp, wp, window, shift, x.device))
        out = self.attn(windows.view(-1, window * window, c), window, mask)
        return out.reshape(b, -1, c).index_select(1, back)

    def _padded_qkv_windows(self, x, hw_shape, window, shift):
        """``qkv`` of the zero-padded map in window order, projecting only the ``H×W`` tokens:
        a padding token's projection is the bias (mmdet's Swin projects the padding too, 12 %
        more ``qkv`` at stage 3 of an 800×1333 image)."""
        slots, pad_slots = window_order_unpadded(*hw_shape, window, shift, x.device)
        windows = self.attn.qkv(x).index_select(1, slots)
        bias = self.attn.qkv.bias
        windows[:, pad_slots] = 0. if bias is None else bias.to(windows.dtype)
        return windows

    def forward(self, x, hw_shape):
        y = self.norm1(x)
        if self.attn_type == 'L':
            y = self.attn(y, hw_shape)
        else:
            y = self.shifted_window_attention(y, hw_shape)
        x = x + self.drop_path(y)
        return mlp_residual(x, self.norm2, self.mlp, self.drop_path, owned=True)


class PatchMerging(nn.Module):
    """2×2 neighbours concatenated, ``LayerNorm(4C)``, ``Linear(4C, 2C, bias=False)`` (Swin).

    The concatenation order is the official one: (even row, even col), (odd row, even col),
    (even row, odd col), (odd row, odd col). Odd sizes get a zero row/column at the
    bottom/right, so ``H×W`` becomes ``ceil(H/2)×ceil(W/2)``.
    """

    def __init__(self, embed_dims):
        super().__init__()
        self.norm = LayerNormFP32(4 * embed_dims)
        self.reduction = Linear(4 * embed_dims, 2 * embed_dims, bias=False)

    def forward(self, x, hw_shape):
        b, _, c = x.shape
        height, width = hw_shape
        x = x.view(b, height, width, c)
        if height % 2 or width % 2:
            x = F.pad(x, (0, 0, 0, width % 2, 0, height % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        hw = (int(x.shape[1]), int(x.shape[2]))
        return self.reduction(self.norm(x.reshape(b, -1, 4 * c))), hw


class FLattenSwinStage(nn.Module):
    """One stage: ``blocks`` then the optional ``downsample`` (official ``BasicLayer`` names)."""

    def __init__(self, blocks, downsample=None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


@register_model
class FLattenSwin(EffBackbone):
    """FLatten-Swin backbone (FLatten Transformer, Han et al., ICCV 2023, sec. 5.1, Fig. 1/5).

    Swin Transformer whose first two stages use focused linear attention (sec. 4, eq. 5-9) and
    whose last two keep Swin's shifted-window softmax attention (``attn_type='LLSS'``, the
    released models). Parameter names follow the official code (``patch_embed.proj/norm``,
    ``layers.i.blocks.j.{norm1,attn.*,norm2,mlp.fc1,mlp.fc2}``, ``layers.i.downsample.
    {norm,reduction}``), so the official ImageNet checkpoints load directly.

    Dense prediction (any ``H×W``; the official code only runs at its training size):

    - ``'L'`` stages attend globally over the whole stage map, as the official models do at
      224² (their window equals the 56×56 / 28×28 map, no shift). Each ``positional_encoding``
      is stored for the ``pretrain_img_size`` stage grid and resized bicubically to the runtime
      map (exact at the pre-training size).
    - ``'S'`` stages: ``window_size`` windows, shift ``window_size // 2`` on odd blocks, input
      padded to window multiples with masks computed for the padded size, cropped back. Like
      mmdet's Swin the window is kept even when a map is smaller than it (default
      ``official_window_rule=False``). The official code instead uses one window of the map's
      size and no shift when the map side is ``≤ window_size``, which at 224² (384²) affects
      stage 4 (7×7, 12×12); ``official_window_rule=True`` reproduces the official classifier's
      features exactly at its training resolution.
    - Odd sizes: the image is padded to patch multiples and patch merging pads odd maps, so a
      ``H×W`` input gives ``ceil(H/4)×ceil(W/4)``, then halved (ceil) per stage.
    - Outputs ``(B, C·2^i, ·, ·)`` for ``out_indices`` pass through LayerNorms ``norm{i}`` (as
      mmdet's Swin). They are not in the official checkpoints: loading one reports them as
      missing keys, which is expected. The classifier's ``head`` is not built, its final
      ``norm`` only with ``final_norm=True`` (see :class:`EffBackbone`).

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'`` (or ``t/s/b``), or a dict with
            ``embed_dims`` (int, stage-1 width), ``depths`` and ``num_heads``.
        in_channels (int): Input channels.
        pretrain_img_size (int | tuple): Resolution the positional encodings are stored for
            (224, or 384 for the fine-tuned Swin-B: then also ``window_size=12``).
        patch_size (int): Patch size of the stem.
        window_size (int): Window of the ``'S'`` stages (official: 7 at 224, 12 at 384).
        mlp_ratio (float): MLP hidden ratio.
        qkv_bias (bool): Bias of the q/k/v projections.
        attn_type (str): One letter per stage, ``'L'`` (focused linear) or ``'S'`` (window).
        focusing_factor (float): Focusing power p of FLA.
        kernel_size (int): Kernel of FLA's depthwise conv.
        drop_rate (float): Dropout after the patch embedding, projections and MLPs.
        attn_drop_rate (float): Dropout on the softmax attention weights.
        drop_path_rate (float): Stochastic depth, increasing linearly over all blocks. Default
            0.1 as the official constructor; its ImageNet recipes use 0.2 / 0.3 / 0.5 for
            T / S / B, the configs use Swin's downstream values (mmdet / mmseg).
        official_window_rule (bool): See above.
        out_indices (Sequence[int]): Stages to output (0-based).
        final_norm (bool): Classification: the official final ``norm`` on the last stage
            instead of the out-norms (:class:`EffBackbone`); with ``official_window_rule=True``
            the official classifier's features at 224².
        frozen_stages (int): See :class:`EffBackbone`; stage i includes its downsample and
            ``norm{i}``.
        norm_eval (bool): See :class:`EffBackbone`.
        with_cp (bool): Gradient checkpointing of every block (saves memory, costs time).
        init_cfg (dict | list, optional): ``dict(type='Pretrained', checkpoint=...)`` loads
            official or OpenMMLab checkpoints.

    Example:
        >>> import torch
        >>> from mmeffvit.models import FLattenSwin
        >>> model = FLattenSwin(arch='tiny').eval()
        >>> outs = model(torch.rand(1, 3, 333, 517))
        >>> [tuple(o.shape) for o in outs]
        [(1, 96, 84, 130), (1, 192, 42, 65), (1, 384, 21, 33), (1, 768, 11, 17)]
    """

    arch_settings = {
        'tiny': dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24]),
        'small': dict(embed_dims=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24]),
        'base': dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32]),
    }
    arch_aliases = {'t': 'tiny', 's': 'small', 'b': 'base'}
    # the index depends only on the window (official fine-tuning deletes it); encodings resized
    # to pretrain_img_size, bias tables to window_size (e.g. the 384² Swin-B into a 224² model)
    ckpt_drop_prefixes = ('head.', 'norm.')
    ckpt_drop_suffixes = ('attn_mask', )
    ckpt_own_leaves = ('relative_position_index', )
    ckpt_resize_rules = ((r'\.positional_encoding$', 'token_grid'),
                         (r'\.relative_position_bias_table$', 'bias_table'))
    final_norm_cfg = dict(eps=1e-5)  # official nn.LayerNorm

    def __init__(self,
                 arch='tiny',
                 in_channels=3,
                 pretrain_img_size=224,
                 patch_size=4,
                 window_size=7,
                 mlp_ratio=4.,
                 qkv_bias=True,
                 attn_type='LLSS',
                 focusing_factor=3,
                 kernel_size=5,
                 drop_rate=0.,
                 attn_drop_rate=0.,
                 drop_path_rate=0.1,
                 official_window_rule=False,
                 out_indices=(0, 1, 2, 3),
                 final_norm=False,
                 frozen_stages=-1,
                 norm_eval=False,
                 with_cp=False,
                 init_cfg=None):
        super().__init__(frozen_stages=frozen_stages, norm_eval=norm_eval, init_cfg=init_cfg,
                         final_norm=final_norm)
        arch = resolve_arch(arch, self.arch_settings, self.arch_aliases,
                            required=('embed_dims', 'depths', 'num_heads'))
        depths, num_heads = list(arch['depths']), list(arch['num_heads'])
        num = len(depths)
        out_indices = check_stage_args(num, out_indices, attn_type, 'attn_type',
                                       num_heads=num_heads)
        if int(window_size) < 1:
            raise ValueError(f'window_size must be >= 1, got {window_size}')
        if isinstance(pretrain_img_size, int):
            pretrain_img_size = (pretrain_img_size, pretrain_img_size)

        self.arch = arch
        self.depths = depths
        self.embed_dims = [int(arch['embed_dims']) * 2 ** i for i in range(num)]
        self.attn_type = attn_type
        self.window_size = int(window_size)
        self.out_indices = out_indices
        self.with_cp = with_cp
        self.num_stages = num
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()

        self.patch_embed = PatchEmbed(in_channels, self.embed_dims[0], patch_size)
        self.pos_drop = nn.Dropout(drop_rate)
        # stage grids at the pre-training size (official: floor division at every stage)
        grid = [s // patch_size for s in pretrain_img_size]
        self.pe_grids = []
        self.layers = nn.ModuleList()
        for i in range(num):
            self.pe_grids.append(tuple(grid))
            dims, start = self.embed_dims[i], sum(depths[:i])
            blocks = [
                FLattenSwinBlock(
                    dims, num_heads[i], attn_type=attn_type[i], window_size=self.window_size,
                    shift_size=0 if j % 2 == 0 else self.window_size // 2,
                    pe_size=tuple(grid), mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                    focusing_factor=focusing_factor, kernel_size=kernel_size,
                    drop_rate=drop_rate, attn_drop_rate=attn_drop_rate, drop_path=dpr[start + j],
                    official_window_rule=official_window_rule) for j in range(depths[i])
            ]
            downsample = PatchMerging(dims) if i < num - 1 else None
            self.layers.append(FLattenSwinStage(blocks, downsample))
            grid = [g // 2 for g in grid]
        for i in out_indices:
            self.add_module(f'norm{i}', self.out_norm_layer(self.embed_dims[i]))
        self.add_final_norm(self.embed_dims[-1])
        self._freeze_stages()

    def stage_modules(self, index):
        if index < 0:
            return [self.patch_embed]
        return [self.layers[index], getattr(self, f'norm{index}', None)]

    def init_random_extras(self):
        # official init; positional encodings and FLA scales stay zero as in the official code
        for m in self.modules():
            if isinstance(m, WindowMSA):
                trunc_normal_(m.relative_position_bias_table, std=.02)

    def forward(self, x):
        x, hw = self.patch_embed(x)
        x = self.pos_drop(x)
        outs = []
        for i, layer in enumerate(self.layers):
            for blk in layer.blocks:
                if self.with_cp and self.training and x.requires_grad:
                    x = cp.checkpoint(blk, x, hw, use_reentrant=False)
                else:
                    x = blk(x, hw)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(x)
                outs.append(tokens_to_contiguous_map(out, hw))
            if layer.downsample is not None:
                x, hw = layer.downsample(x, hw)
        return tuple(outs)
