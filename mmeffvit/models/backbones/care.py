"""CARE Transformer: decoupled dual interaction with linear attention (Zhou et al., CVPR 2025)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from timm.layers import DropPath

from ... import ops
from ...registry import register_model
from ...utils import at_least_fp32, unknown_choice_error
from ..layers.window import pad_to_multiple
from .base import EffBackbone, resolve_arch


def _dwconv(channels, kernel_size, padding):
    return nn.Conv2d(channels, channels, kernel_size, padding=padding, groups=channels)


class TokenMixer(nn.Module):
    """Asymmetric decoupling of a block's channels (sec. 3.2).

    The ``4m`` channels are split into ``[memory | global | local 3×3 | local 7×7]`` (``m`` each).
    The memory slice bypasses the mixer. The global slice goes through linear attention in
    stages 3-4 (ELU+1 kernel on a 1×1 ``qk`` projection, the input itself as value, sums scaled by
    ``1/N``, no softmax and no output projection: FLatten's mean-normalised
    :func:`mmeffvit.ops.linear_attention` computes exactly this, in fp32) and through an
    11×1 + 1×11 strip depthwise pair in stages 1-2. The two local slices go through depthwise
    3×3 and 7×7 convs.

    Args:
        mem_dims (int): ``m``, the width of each of the four slices.
        head_dims (int | None): Channels per attention head; None selects the strip convs.
    """

    def __init__(self, mem_dims, head_dims=None):
        super().__init__()
        self.mem_dims = mem_dims
        self.head_dims = head_dims
        if head_dims is not None:
            if mem_dims % head_dims:
                raise ValueError(f'attention width {mem_dims} is not divisible by the head '
                                 f'width {head_dims}')
            self.qk = nn.Conv2d(mem_dims, 2 * mem_dims, 1)
        else:
            self.dwconvatt_1 = _dwconv(mem_dims, (11, 1), (5, 0))
            self.dwconvatt_2 = _dwconv(mem_dims, (1, 11), (0, 5))
        self.dwconv1 = _dwconv(mem_dims, 3, 1)
        self.dwconv2 = _dwconv(mem_dims, 7, 3)

    def attention(self, x):
        """Linear attention of the global slice ``x`` ``(B, m, H, W)``; heads own consecutive
        channel groups (channel ``c`` belongs to head ``c // head_dims``)."""
        b, c, h, w = x.shape
        qk = self.qk(x)

        def heads(t):
            return t.reshape(b, c // self.head_dims, self.head_dims, h * w).transpose(-2, -1)

        with torch.autocast(device_type=x.device.type, enabled=False):
            # the ELU+1 kernel on q and k at once
            q, k = (F.elu(at_least_fp32(qk)) + 1.0).chunk(2, dim=1)
            out = ops.linear_attention(heads(q), heads(k), heads(at_least_fp32(x)),
                                       normalizer='mean', eps=1e-6)
        return out.transpose(-2, -1).reshape(b, c, h, w).to(x.dtype)

    def forward(self, x):
        mem, glob, loc3, loc7 = x.split(self.mem_dims, dim=1)
        if self.head_dims is not None:
            glob = self.attention(glob)
        else:
            glob = self.dwconvatt_1(glob) + self.dwconvatt_2(glob)
        return mem, torch.cat([glob, self.dwconv1(loc3), self.dwconv2(loc7)], dim=1)


class InterModule(nn.Module):
    """Dual interaction (sec. 3.3): two ``norm → 1×1 expand → GELU → DW3×3 → 1×1`` units.

    ``inter1`` mixes the three feature slices (local ↔ global, residual); ``inter2`` mixes the
    memory with them (across layers, residual). With ``last=True`` ``inter2`` stops after the
    depthwise conv: no projection and no residual, the released network's final expansion.
    """

    def __init__(self, dims, mem_dims, ratios, last=False, norm_cfg=dict(type='BN')):
        super().__init__()
        r1, r2 = ratios
        feat = 3 * mem_dims
        self.last = last
        self.inter1_norm = build_norm_layer(norm_cfg, feat)[1]
        self.inter1_fc1 = nn.Conv2d(feat, r1 * feat, 1)
        self.inter1_act = nn.GELU()
        self.inter1_conv = _dwconv(r1 * feat, 3, 1)
        self.inter1_fc2 = nn.Conv2d(r1 * feat, feat, 1)
        self.inter2_norm = build_norm_layer(norm_cfg, dims)[1]
        self.inter2_fc1 = nn.Conv2d(dims, r2 * dims, 1)
        self.inter2_act = nn.GELU()
        self.inter2_conv = _dwconv(r2 * dims, 3, 1)
        if not last:
            self.inter2_fc2 = nn.Conv2d(r2 * dims, dims, 1)

    def forward(self, mem, feats):
        feats = feats + self.inter1_fc2(self.inter1_conv(self.inter1_act(
            self.inter1_fc1(self.inter1_norm(feats)))))
        u = torch.cat([mem, feats], dim=1)  # memory first
        hidden = self.inter2_conv(self.inter2_act(self.inter2_fc1(self.inter2_norm(u))))
        return hidden if self.last else u + self.inter2_fc2(hidden)


class CAREBlock(nn.Module):
    """``x + DropPath(γ ⊙ Inter(Mixer(x)))`` with LayerScale ``γ`` (1e-6 at init).

    The last block of the released network (``last=True``) has no ``γ`` and no residual and
    returns the ``r2·4m``-channel expansion of :class:`InterModule`.
    """

    def __init__(self, dims, mem_dims, ratios, head_dims=None, last=False, drop_path=0.,
                 layer_scale_init=1e-6, norm_cfg=dict(type='BN')):
        super().__init__()
        self.last = last
        self.token_mixer = TokenMixer(mem_dims, head_dims)
        self.inter_layer = InterModule(dims, mem_dims, ratios, last, norm_cfg)
        if not last:
            self.gamma = nn.Parameter(torch.full((dims, ), float(layer_scale_init)))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x):
        y = self.inter_layer(*self.token_mixer(x))
        if self.last:
            return self.drop_path(y)
        # DropPath scales each sample, so it commutes with γ: x + γ ⊙ y in one op
        return torch.addcmul(x, self.drop_path(y), self.gamma.reshape(1, -1, 1, 1))


class Downsample(nn.Sequential):
    """``BN → Conv2×2/2`` over the whole ``[memory; features]`` tensor (sec. 3.4); the first
    ``m`` output channels become the next stage's memory. Odd sizes are zero-padded (after the
    BN) to even, so the output is ``ceil(size / 2)`` (the official code floors)."""

    def __init__(self, in_channels, out_channels, norm_cfg=dict(type='BN')):
        super().__init__(build_norm_layer(norm_cfg, in_channels)[1],
                         nn.Conv2d(in_channels, out_channels, 2, stride=2))

    def forward(self, x):
        return self[1](pad_to_multiple(self[0](x), 2))


class CAREStage(nn.Module):
    """Optional :class:`Downsample` followed by the stage's blocks (official names)."""

    def __init__(self, blocks, downsample=None):
        super().__init__()
        if downsample is not None:
            self.downsample = downsample
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x):
        if hasattr(self, 'downsample'):
            x = self.downsample(x)
        return self.blocks(x)


@register_model
class CARE(EffBackbone):
    """CARE Transformer backbone (Zhou et al., "CARE Transformer: Mobile-Friendly Linear Visual
    Transformer via Decoupled Dual Interaction", CVPR 2025).

    Conv stem 4×4/4 + BN, then four stages (strides 4/8/16/32) of :class:`CAREBlock`: asymmetric
    decoupling into memory / global / local slices (:class:`TokenMixer`, linear attention in
    stages 3-4 and strip convs in stages 1-2), the dual interaction (:class:`InterModule`, with the
    per-stage expansion ratios of the official code) and LayerScale. The dynamic memory is carried
    across stages by the downsampling conv. Names follow the official ``CARENets`` (``stem.*``,
    ``stages.{i}.downsample.*``, ``stages.{i}.blocks.{j}.*``), so the released ImageNet files
    (raw state dicts) load through ``init_cfg=dict(type='Pretrained', ...)``; the two classifier
    heads (``head.*``, ``dist_head.*``) are dropped.

    Stage-4 output (``last_block``): the released network ends with a non-residual block that
    returns an expanded ``r2·4m`` map (1024 channels for S0/S1, 1536 for S2) feeding the
    classifier. ``'expanded'`` (default) keeps it: the released model exactly, every checkpoint
    tensor used, the neck sees 1024/1536 channels. ``'residual'`` builds a regular last block
    (256/384 channels); its ``gamma`` and ``inter_layer.inter2_fc2`` are then absent from the
    checkpoint and start fresh (γ = 1e-6 keeps the block near identity). The drop path of the
    non-residual block would zero a sample's whole stage-4 output; it is disabled unless
    ``last_block_drop_path=True``.

    BatchNorm everywhere: train with SyncBN (``sync_bn='torch'`` in the config, as ours do) or
    with ``norm_eval=True``; plain BN at 2 images/GPU is not recommended.

    Args:
        arch (str | dict): ``'s0'``, ``'s1'``, ``'s2'`` or a dict with ``depths``, ``mem_dims``,
            ``ratios`` and ``head_dims`` (channels per attention head, None = strip convs).
        in_channels (int): Input channels.
        last_block (str): ``'expanded'`` or ``'residual'``, see above.
        last_block_drop_path (bool): Apply drop path to the non-residual last block.
        layer_scale_init (float): Initial LayerScale γ.
        drop_path_rate (float): Stochastic depth, increasing linearly over all blocks.
        out_indices (Sequence[int]): Stages to output (0-based).
        norm_cfg (dict): Norm of every BN slot (stem, downsampling, interaction modules).
        frozen_stages (int): See :class:`EffBackbone`.
        norm_eval (bool): See :class:`EffBackbone`.
        init_cfg (dict | list, optional): Initialisation.

    Example:
        >>> import torch
        >>> from mmeffvit.models import CARE
        >>> model = CARE(arch='s0').eval()
        >>> outs = model(torch.rand(1, 3, 333, 517))
        >>> [tuple(o.shape) for o in outs]
        [(1, 32, 84, 130), (1, 64, 42, 65), (1, 128, 21, 33), (1, 1024, 11, 17)]
    """

    arch_settings = {
        's0': dict(depths=[2, 4, 8, 4], mem_dims=[8, 16, 32, 64],
                   ratios=[(2, 2), (2, 4), (4, 4), (4, 4)], head_dims=[None, None, 16, 32]),
        's1': dict(depths=[3, 6, 10, 6], mem_dims=[8, 16, 32, 64],
                   ratios=[(2, 4), (2, 4), (4, 4), (4, 4)], head_dims=[None, None, 16, 32]),
        's2': dict(depths=[3, 6, 10, 6], mem_dims=[8, 16, 48, 96],
                   ratios=[(4, 4)] * 4, head_dims=[None, None, 16, 32]),
    }
    arch_aliases = {f'caretrans_s{i}': f's{i}' for i in range(3)}
    # raw official state dicts; the two classifier heads are not built
    ckpt_strip_prefixes = ('module.', 'backbone.')
    ckpt_drop_prefixes = ('head.', 'dist_head.')
    # official Head modules (GELU, norm, fc) → mmeffvit's CAREClsHead (norm, fc, dist_norm, ...)
    ckpt_cls_head_prefixes = (('head.', 'head.'), ('dist_head.', 'head.dist_'))
    default_init_cfg = [
        dict(type='TruncNormal', layer=['Conv2d', 'Linear'], std=.02, bias=0.),
        dict(type='Constant', layer=['_BatchNorm', 'LayerNorm'], val=1., bias=0.),
    ]

    def __init__(self,
                 arch='s0',
                 in_channels=3,
                 last_block='expanded',
                 last_block_drop_path=False,
                 layer_scale_init=1e-6,
                 drop_path_rate=0.,
                 out_indices=(0, 1, 2, 3),
                 norm_cfg=dict(type='BN'),
                 frozen_stages=-1,
                 norm_eval=False,
                 init_cfg=None):
        super().__init__(frozen_stages=frozen_stages, norm_eval=norm_eval, init_cfg=init_cfg)
        arch = resolve_arch(arch, self.arch_settings, self.arch_aliases,
                            required=('depths', 'mem_dims', 'ratios', 'head_dims'))
        depths, mem = list(arch['depths']), list(arch['mem_dims'])
        if not len(depths) == len(mem) == len(arch['ratios']) == len(arch['head_dims']) == 4:
            raise ValueError('arch depths, mem_dims, ratios and head_dims need 4 entries each')
        if last_block not in ('expanded', 'residual'):
            raise unknown_choice_error('last_block', last_block, ['expanded', 'residual'])
        out_indices = tuple(out_indices)
        if not out_indices or any(not 0 <= i < 4 for i in out_indices):
            raise ValueError(f'out_indices must be a non-empty subset of 0..3, got {out_indices}')
        self.arch = arch
        self.depths = depths
        self.last_block = last_block
        self.out_indices = out_indices
        dims = [4 * m for m in mem]
        self.embed_dims = dims
        # widths of the stage outputs (stage 4 expanded by r2 in the released network)
        self.out_channels = dims[:3] + [
            dims[3] * arch['ratios'][3][1] if last_block == 'expanded' else dims[3]]
        dpr = torch.linspace(0, drop_path_rate, sum(depths), device='cpu').tolist()

        self.stem = nn.Sequential(nn.Conv2d(in_channels, dims[0], 4, stride=4),
                                  build_norm_layer(norm_cfg, dims[0])[1])
        stages = []
        for i in range(4):
            blocks = []
            for j in range(depths[i]):
                last = last_block == 'expanded' and i == 3 and j == depths[i] - 1
                rate = dpr[sum(depths[:i]) + j]
                if last and not last_block_drop_path:
                    rate = 0.
                blocks.append(CAREBlock(dims[i], mem[i], tuple(arch['ratios'][i]),
                                        arch['head_dims'][i], last, rate, layer_scale_init,
                                        norm_cfg))
            down = Downsample(dims[i - 1], dims[i], norm_cfg) if i > 0 else None
            stages.append(CAREStage(blocks, down))
        self.stages = nn.Sequential(*stages)
        self._freeze_stages()

    def stage_modules(self, index):
        return [self.stem] if index < 0 else [self.stages[index]]

    def forward(self, x):
        # stride-4 stem over a right/bottom zero-padded image: ceil(size / 4) for odd sizes
        x = self.stem(pad_to_multiple(x, 4))
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)
