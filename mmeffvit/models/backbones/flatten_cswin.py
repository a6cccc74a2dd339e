"""FLatten-CSWin: CSWin Transformer with focused linear attention (FLatten, ICCV 2023, sec. 5)."""
import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from timm.layers import DropPath

from ... import ops
from ...registry import register_model
from ...utils import map_to_tokens, tokens_to_contiguous_map, tokens_to_map
from ..layers import DepthwiseConv2d, FocusedLinearAttention, LayerNormFP32, pad_to_multiple
from ..layers.linear import Linear, Mlp, mlp_residual
from .base import EffBackbone, check_stage_args, resolve_arch


class ConvStem(nn.Sequential):
    """CSWin's overlapping stem: Conv 7×7 stride 4 pad 2, tokens, LayerNorm (sec. 3.1 of CSWin).

    Slot 1 stands where the official ``Rearrange`` (no parameters) is, so the weights keep the
    names ``stage1_conv_embed.0`` (conv) and ``stage1_conv_embed.2`` (norm). Inputs are
    zero-padded at the bottom/right to a multiple of 4 first: every stage map is then
    ``ceil(H / 2^(i+2))`` high, aligned with FPN strides (identical to the official stem when the
    input is a multiple of 4).
    """

    def __init__(self, in_channels, embed_dims):
        super().__init__(nn.Conv2d(in_channels, embed_dims, 7, stride=4, padding=2),
                         nn.Identity(), LayerNormFP32(embed_dims))

    def forward(self, x):
        x, hw = map_to_tokens(self[0](pad_to_multiple(x, 4)))
        return self[2](x), hw


class MergeBlock(nn.Module):
    """Down-sampling between stages: Conv 3×3 stride 2 pad 1 (C → 2C) and LayerNorm."""

    def __init__(self, in_dims, out_dims):
        super().__init__()
        self.conv = nn.Conv2d(in_dims, out_dims, 3, stride=2, padding=1)
        self.norm = LayerNormFP32(out_dims)

    def forward(self, x, hw):
        x, hw = map_to_tokens(self.conv(tokens_to_map(x, hw)))
        return self.norm(x), hw


class LePEAttention(nn.Module):
    """Softmax attention in cross-shaped stripes with LePE (CSWin, sec. 3.2–3.3).

    One branch: ``idx=0`` attends within vertical stripes (full height, ``split_size`` wide),
    ``idx=1`` within horizontal stripes (``split_size`` high, full width), ``idx=-1`` over the
    whole map (a single window). Scores use ``q·k·d^-0.5``; the locally-enhanced positional
    encoding ``get_v`` (depthwise 3×3 conv) runs on v inside each stripe window and is added to
    the attention output.

    Any ``H×W``: the map is zero-padded at the bottom/right to a multiple of the stripe width where
    stripes need it, padded keys are ignored by the softmax and the output is cropped
    (:func:`mmeffvit.ops.stripe_attention`). Because padded v
    is zero too, a real token's output is exactly what a shorter last stripe (with the conv's
    own zero padding at its edge) gives;
    ``tests/test_flatten_cswin.py`` checks this against an unpadded, stripe-by-stripe reference.

    Args:
        embed_dims (int): Channels of this branch.
        num_heads (int): Heads of this branch.
        split_size (int): Stripe width ``sw``.
        idx (int): Stripe orientation, see above.
        qk_scale (float, optional): Overrides ``d^-0.5``.
        attn_drop (float): Dropout on the attention weights.
    """

    fused_modules = ('get_v', )  # its weight and bias are read by the op, it is not called

    def __init__(self, embed_dims, num_heads, split_size, idx, qk_scale=None, attn_drop=0.):
        super().__init__()
        if idx not in (-1, 0, 1):
            raise ValueError(f'idx must be -1, 0 or 1, got {idx}')
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims {embed_dims} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.split_size = split_size
        self.idx = idx
        self.scale = qk_scale or (embed_dims // num_heads) ** -0.5
        self.get_v = nn.Conv2d(embed_dims, embed_dims, 3, padding=1, groups=embed_dims)
        self.attn_drop = nn.Dropout(attn_drop)

    def window_shape(self, hw):
        """Stripe window ``(wh, ww)`` on a map of ``hw``."""
        h, w = hw
        if self.idx == -1:
            return h, w
        return (h, self.split_size) if self.idx == 0 else (self.split_size, w)

    def forward(self, q, k, v, hw):
        """Args: q, k, v ``(B, H*W, C)`` (views into the block's ``qkv`` are fine); hw
        ``(H, W)``. Returns ``(B, H*W, C)``: :func:`mmeffvit.ops.stripe_attention` in this
        branch's windows with its LePE."""
        drop = self.attn_drop.p if self.training else 0.
        return ops.stripe_attention(q, k, v, hw, self.window_shape(hw), self.num_heads,
                                    self.get_v.weight, self.get_v.bias, scale=self.scale,
                                    dropout=drop)


class LePEFocusedLinearAttention(FocusedLinearAttention):
    """FLatten's focused linear attention over the whole map plus CSWin's LePE (FLatten sec. 5.1).

    The shared :class:`FocusedLinearAttention` core (``qkv_layout=None``: the CSWin block owns
    ``qkv`` and ``proj``) with its ``scale``, ``positional_encoding`` and ``dwc``, plus
    ``get_v``, a depthwise 3×3 conv on v added to the output, as the official CSWin variant does
    inside its attention. Keeps the official names ``attns.0.{scale, positional_encoding, dwc,
    get_v}``. The official ``la_split_size`` equals the stage resolution (one window = the whole
    map), which is what this module computes at any size; ``pe_size`` is that resolution at
    pre-training, resized at run time.
    """

    def __init__(self, embed_dims, num_heads, pe_size, focusing_factor=3, kernel_size=5):
        super().__init__(embed_dims, num_heads, pe_size=pe_size, focusing_factor=focusing_factor,
                         kernel_size=kernel_size, qkv_layout=None)
        self.get_v = DepthwiseConv2d(embed_dims, 3)

    def forward(self, q, k, v, hw):
        """Args: q, k, v ``(B, H*W, C)``; hw ``(H, W)``. Returns ``(B, H*W, C)``."""
        lepe = self.get_v(v, hw)
        out = self.attend(q, k, v, hw)
        return out + lepe.to(out.dtype)


class FLattenCSWinBlock(nn.Module):
    """CSWin block: ``x + proj(attn(qkv(norm1(x))))``, then ``x + mlp(norm2(x))`` (CSWin sec. 3.4).

    ``qkv`` and ``proj`` live in the block (official layout). ``attn_type='L'``: one
    :class:`LePEFocusedLinearAttention` branch on all channels and heads. ``'S'``: with
    ``branches=2``, two :class:`LePEAttention` branches on C/2 channels and h/2 heads each
    (vertical stripes on the first half of the channels, horizontal on the second, as the
    official ``attns.0`` / ``attns.1``); with ``branches=1`` one branch over the whole map.
    """

    def __init__(self, embed_dims, num_heads, attn_type='L', split_size=7, branches=2, pe_size=None,
                 mlp_ratio=4., qkv_bias=True, qk_scale=None, focusing_factor=3, kernel_size=5,
                 drop_rate=0., attn_drop_rate=0., drop_path=0.):
        super().__init__()
        self.norm1 = LayerNormFP32(embed_dims)
        self.qkv = Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        if attn_type == 'L':
            attns = [LePEFocusedLinearAttention(embed_dims, num_heads, pe_size, focusing_factor,
                                                kernel_size)]
        elif attn_type == 'S' and branches == 1:
            attns = [LePEAttention(embed_dims, num_heads, split_size, -1, qk_scale, attn_drop_rate)]
        elif attn_type == 'S':
            if embed_dims % 2 or num_heads % 2:
                raise ValueError(f'two-branch stripes need even channels and heads, got '
                                 f'{embed_dims} channels and {num_heads} heads')
            attns = [LePEAttention(embed_dims // 2, num_heads // 2, split_size, i, qk_scale,
                                   attn_drop_rate) for i in range(2)]
        else:
            raise ValueError(f"attn_type must be 'L' or 'S', got {attn_type!r}")
        self.attns = nn.ModuleList(attns)
        # the official block builds a proj_drop but never applies it; drop_rate acts in the MLP
        self.proj = Linear(embed_dims, embed_dims)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = LayerNormFP32(embed_dims)
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop=drop_rate)

    def forward(self, x, hw):
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        if len(self.attns) == 1:
            out = self.attns[0](q, k, v, hw)
        else:  # vertical stripes on the first half of the channels, horizontal on the second
            half = x.shape[-1] // 2
            out = torch.cat([attn(q[..., sl], k[..., sl], v[..., sl], hw) for attn, sl in
                             zip(self.attns, (slice(0, half), slice(half, None)))], dim=-1)
        x = x + self.drop_path(self.proj(out))
        return mlp_residual(x, self.norm2, self.mlp, self.drop_path, owned=True)


@register_model
class FLattenCSWin(EffBackbone):
    """FLatten-CSWin backbone (FLatten Transformer, Han et al., ICCV 2023, sec. 5, 5.1).

    CSWin Transformer (Dong et al., CVPR 2022) with ``attn_types='LLSS'``: stages 1–2 use focused
    linear attention over the whole stage map (the official ``la_split_size`` equals the stage
    resolution) plus CSWin's LePE; stage 3 keeps CSWin's two-branch cross-shaped stripe attention
    (stripes of width 7, or 12 for the 384 model); stage 4 keeps one softmax branch over the whole
    map. Parameter names follow the official code (``stage1_conv_embed.{0,2}``,
    ``merge{1..3}.{conv,norm}``, ``stage{s}.{j}.{norm1,qkv,attns,proj,norm2,mlp}``), so the official
    ImageNet checkpoints load directly.

    Dense prediction, any input size:

    * Stripe stages pad their map to multiples of the stripe width (masking padded keys, cropping
      back); see :class:`LePEAttention`.
    * Stage 4 is a single branch whenever it is the last stage (as in the official code, where its
      7×7 map at 224² equals the split size): on larger inputs it stays **full attention over the
      whole map** with LePE over the whole map, not 7×7 windows. Other ``'S'`` stages use one
      whole-map branch when ``split_size`` covers their pre-training resolution.
    * The ``positional_encoding`` of every linear-attention block is stored for the pre-training
      grid (56² and 28² at 224) and resized to the runtime map (see
      :class:`FocusedLinearAttention`).
    * Per-output LayerNorms ``norm{i}`` (i = 0-based stage index in ``out_indices``, as mmdet's
      Swin) are added for the dense outputs; the official model has only the final ``norm`` of the
      classifier, so ``norm{i}`` are expected missing keys when loading and ``norm.*``/``head.*``
      are dropped. ``final_norm=True`` builds that final ``norm`` instead (classification, see
      :class:`EffBackbone`).

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'``, ``'base_384'`` (or ``t/s/b/b384``),
            or a dict with ``embed_dims`` (int, stage 1), ``depths``, ``num_heads`` and optionally
            ``split_sizes``, ``pretrain_img_size``.
        in_channels (int): Input channels.
        pretrain_img_size (int | tuple, optional): Resolution the position tensors are stored for
            and which decides one- vs two-branch stripes; default: the arch's (224, or 384).
        split_sizes (Sequence[int], optional): Stripe width of each stage's ``'S'`` blocks;
            default: the arch's (1, 2, 7, 7), or 1, 2, 12, 12 at 384.
        attn_types (str): ``'L'`` or ``'S'`` per stage (official ``attn_type``; ``'LLSS'``).
        mlp_ratio (float): MLP hidden ratio.
        qkv_bias (bool): Bias of ``qkv``.
        qk_scale (float, optional): Overrides ``d^-0.5`` in the stripe attention.
        focusing_factor (float): Focusing power p of the linear attention.
        kernel_size (int): Kernel of the linear attention's rank-restoring depthwise conv.
        drop_rate (float): Dropout in the MLPs.
        attn_drop_rate (float): Dropout on softmax attention weights.
        drop_path_rate (float): Stochastic depth, increasing linearly over all blocks (default
            0.2, CSWin-T's ImageNet value; the configs use 0.2 / 0.4 / 0.5 for T / S / B).
        out_indices (Sequence[int]): Stages to output (0-based).
        out_norm (bool): Apply ``norm{i}`` to every output.
        final_norm (bool): Classification: the official final ``norm`` on the last stage
            instead of the out-norms (:class:`EffBackbone`).
        with_cp (bool): Gradient checkpointing of each block (official ``use_chk``).
        frozen_stages (int): See :class:`EffBackbone`; stage i includes ``merge{i}`` and
            ``norm{i}``.
        norm_eval (bool): See :class:`EffBackbone`.
        init_cfg (dict | list, optional): Initialisation; ``dict(type='Pretrained',
            checkpoint=...)`` loads official or OpenMMLab checkpoints.

    Example:
        >>> import torch
        >>> from mmeffvit.models import FLattenCSWin
        >>> model = FLattenCSWin(arch='tiny').eval()
        >>> outs = model(torch.rand(1, 3, 333, 517))
        >>> [tuple(o.shape) for o in outs]
        [(1, 64, 84, 130), (1, 128, 42, 65), (1, 256, 21, 33), (1, 512, 11, 17)]
    """

    arch_settings = {
        'tiny': dict(embed_dims=64, depths=[2, 4, 18, 1], num_heads=[2, 4, 8, 16]),
        'small': dict(embed_dims=64, depths=[2, 4, 32, 2], num_heads=[2, 4, 8, 16]),
        'base': dict(embed_dims=96, depths=[3, 6, 29, 2], num_heads=[4, 8, 16, 32]),
        'base_384': dict(embed_dims=96, depths=[3, 6, 29, 2], num_heads=[4, 8, 16, 32],
                         split_sizes=[1, 2, 12, 12], pretrain_img_size=384),
    }
    arch_aliases = {'t': 'tiny', 's': 'small', 'b': 'base', 'b384': 'base_384',
                    'base384': 'base_384'}
    # dense outputs have their own norm{i} (expected missing); encodings resized to the grids
    ckpt_drop_prefixes = ('head.', 'norm.')
    ckpt_resize_rules = ((r'\.positional_encoding$', 'token_grid'), )
    final_norm_cfg = dict(eps=1e-5)  # official nn.LayerNorm

    def __init__(self,
                 arch='tiny',
                 in_channels=3,
                 pretrain_img_size=None,
                 split_sizes=None,
                 attn_types='LLSS',
                 mlp_ratio=4.,
                 qkv_bias=True,
                 qk_scale=None,
                 focusing_factor=3,
                 kernel_size=5,
                 drop_rate=0.,
                 attn_drop_rate=0.,
                 drop_path_rate=0.2,
                 out_indices=(0, 1, 2, 3),
                 out_norm=True,
                 final_norm=False,
                 with_cp=False,
                 frozen_stages=-1,
                 norm_eval=False,
                 init_cfg=None):
        super().__init__(frozen_stages=frozen_stages, norm_eval=norm_eval, init_cfg=init_cfg,
                         final_norm=final_norm)
        arch = resolve_arch(arch, self.arch_settings, self.arch_aliases,
                            required=('embed_dims', 'depths', 'num_heads'))
        depths, heads = list(arch['depths']), list(arch['num_heads'])
        num = len(depths)
        split_sizes = list(split_sizes or arch.get('split_sizes', [1, 2, 7, 7]))
        pretrain_img_size = pretrain_img_size or arch.get('pretrain_img_size', 224)
        if isinstance(pretrain_img_size, int):
            pretrain_img_size = (pretrain_img_size, pretrain_img_size)
        out_indices = check_stage_args(num, out_indices, attn_types, num_heads=heads,
                                       split_sizes=split_sizes)

        self.arch = arch
        self.embed_dims = [arch['embed_dims'] * 2 ** i for i in range(num)]
        self.depths = depths
        self.out_indices = out_indices
        self.out_norm = out_norm
        self.with_cp = with_cp
        self.num_stages = num
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()

        self.stage1_conv_embed = ConvStem(in_channels, self.embed_dims[0])
        for i in range(num):
            dims = self.embed_dims[i]
            if i > 0:
                setattr(self, f'merge{i}', MergeBlock(self.embed_dims[i - 1], dims))
            grid = tuple(s // 2 ** (i + 2) for s in pretrain_img_size)
            # official rule: one branch in the last stage or when a stripe spans the whole map
            branches = 1 if i == num - 1 or split_sizes[i] >= max(grid) else 2
            start = sum(depths[:i])
            setattr(self, f'stage{i + 1}', nn.ModuleList([
                FLattenCSWinBlock(dims, heads[i], attn_type=attn_types[i],
                                  split_size=split_sizes[i], branches=branches, pe_size=grid,
                                  mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                  focusing_factor=focusing_factor, kernel_size=kernel_size,
                                  drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                                  drop_path=dpr[start + j]) for j in range(depths[i])
            ]))
            if out_norm and i in out_indices:
                setattr(self, f'norm{i}', self.out_norm_layer(dims))
        self.add_final_norm(self.embed_dims[-1])
        self._freeze_stages()

    def stage_modules(self, index):
        if index < 0:
            return [self.stage1_conv_embed]
        mods = [getattr(self, f'stage{index + 1}'), getattr(self, f'norm{index}', None)]
        if index > 0:
            mods.append(getattr(self, f'merge{index}'))
        return mods

    def _run_block(self, blk, x, hw):
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(blk, x, hw, use_reentrant=False)
        return blk(x, hw)

    def forward(self, x):
        x, hw = self.stage1_conv_embed(x)
        outs = []
        for i in range(self.num_stages):
            if i > 0:
                x, hw = getattr(self, f'merge{i}')(x, hw)
            for blk in getattr(self, f'stage{i + 1}'):
                x = self._run_block(blk, x, hw)
            if i in self.out_indices:
                y = getattr(self, f'norm{i}')(x) if self.out_norm else x
                outs.append(tokens_to_contiguous_map(y, hw))
        return tuple(outs)
