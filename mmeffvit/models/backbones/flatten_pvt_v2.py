"""FLatten-PVTv2: PVT v2 with focused linear attention (FLatten Transformer, ICCV 2023, sec. 5)."""
import math

import torch
import torch.nn as nn

from ...registry import register_model
from ...utils import tokens_to_contiguous_map
from ..layers import FLattenPVTBlock, LayerNormFP32, PatchEmbed
from .base import EffBackbone, check_stage_args, resolve_arch

# widths of B1-B5 (official flatten_pvt_v2_b* factories); B0 halves the channels
_V2_WIDTHS = dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4])


def _conv_out(size, kernel, stride):
    """Output length of a conv with ``padding = kernel // 2`` (= ceil(size / stride) here)."""
    return (size + 2 * (kernel // 2) - kernel) // stride + 1


@register_model
class FLattenPVTv2(EffBackbone):
    """FLatten-PVTv2 backbone (FLatten Transformer, Han et al., ICCV 2023, sec. 5.1).

    PVT v2 (overlapping patch embeddings, depthwise conv in the MLP, no absolute position
    embedding) with focused linear attention in every block (``attn_types='LLLL'``, no spatial
    reduction and ``linear=False``: the released configuration). Parameter names follow the
    official ``flatten_pvt_v2.py`` (``patch_embed{i}.proj/norm``, ``block{i}.{j}.attn.q/kv/proj/
    scale/positional_encoding/dwc``, ``block{i}.{j}.mlp.fc1/dwconv.dwconv/fc2``, ``norm{i}``) so
    the official ImageNet checkpoints load directly. PVT v2's linear spatial-reduction variant
    (``*_li``, average pooling to 7×7) is not provided: FLatten never released it.

    Each stage ends with its LayerNorm ``norm{i}`` (eps 1e-6), which the official model applies
    before handing the map to the next stage; the normalised maps are also the outputs, so they
    serve as natural out-norms for dense prediction. The classifier ``head`` is not built.

    Dense prediction: any input size works (the ``k//2``-padded strided convs give
    ``ceil`` sizes); each attention's positional encoding is stored for the
    ``pretrain_img_size`` grid (56, 28, 14, 7 at 224) and resized to the runtime grid (see
    :class:`FocusedLinearAttention`).

    Args:
        arch (str | dict): ``'b0'`` ... ``'b5'``, or a dict with ``embed_dims``, ``num_heads``,
            ``mlp_ratios``, ``depths`` and optionally ``sr_ratios``, ``attn_types``
            (``'L'`` focused linear, ``'S'`` PVT softmax attention per stage).
        in_channels (int): Input channels.
        pretrain_img_size (int | tuple): Resolution the positional encodings are stored for.
        patch_sizes (tuple[int]): Kernel of each stage's overlapping embedding (7, 3, 3, 3).
        strides (tuple[int]): Stride of each stage's embedding (4, 2, 2, 2).
        qkv_bias (bool): Bias of q/kv projections.
        focusing_factor (float): Focusing power p.
        kernel_size (int): Kernel of the rank-restoring depthwise conv.
        drop_rate (float): Dropout rate.
        drop_path_rate (float): Stochastic depth, increasing linearly over all blocks
            (official recipe: 0.1 for B0-B2, 0.3 for B3/B4).
        out_indices (Sequence[int]): Stages to output (0-based).
        frozen_stages (int): See :class:`EffBackbone`.
        norm_eval (bool): See :class:`EffBackbone`.
        init_cfg (dict | list, optional): Initialisation; ``dict(type='Pretrained',
            checkpoint=...)`` loads official or OpenMMLab checkpoints. The random
            initialisation is the official one (see :meth:`init_random_extras`).

    Example:
        >>> import torch
        >>> from mmeffvit.models import FLattenPVTv2
        >>> model = FLattenPVTv2(arch='b0').eval()
        >>> outs = model(torch.rand(1, 3, 333, 517))
        >>> [tuple(o.shape) for o in outs]
        [(1, 32, 84, 130), (1, 64, 42, 65), (1, 160, 21, 33), (1, 256, 11, 17)]
    """

    arch_settings = {
        'b0': dict(_V2_WIDTHS, embed_dims=[32, 64, 160, 256], depths=[2, 2, 2, 2]),
        'b1': dict(_V2_WIDTHS, depths=[2, 2, 2, 2]),
        'b2': dict(_V2_WIDTHS, depths=[3, 4, 6, 3]),
        'b3': dict(_V2_WIDTHS, depths=[3, 4, 18, 3]),
        'b4': dict(_V2_WIDTHS, depths=[3, 8, 27, 3]),
        'b5': dict(_V2_WIDTHS, mlp_ratios=[4, 4, 4, 4], depths=[3, 6, 40, 3]),
    }
    arch_aliases = {f'pvt_v2_b{i}': f'b{i}' for i in range(6)}
    # the stage norms norm{i} belong to the backbone; encodings resized to pretrain_img_size
    ckpt_resize_rules = ((r'\.positional_encoding$', 'token_grid'), )

    def __init__(self,
                 arch='b0',
                 in_channels=3,
                 pretrain_img_size=224,
                 patch_sizes=(7, 3, 3, 3),
                 strides=(4, 2, 2, 2),
                 qkv_bias=True,
                 focusing_factor=3,
                 kernel_size=5,
                 drop_rate=0.,
                 drop_path_rate=0.1,
                 out_indices=(0, 1, 2, 3),
                 frozen_stages=-1,
                 norm_eval=False,
                 init_cfg=None):
        super().__init__(frozen_stages=frozen_stages, norm_eval=norm_eval, init_cfg=init_cfg)
        arch = resolve_arch(arch, self.arch_settings, self.arch_aliases,
                            required=('embed_dims', 'num_heads', 'mlp_ratios', 'depths'))
        num = len(arch['depths'])
        sr_ratios = arch.get('sr_ratios', [1] * num)
        attn_types = arch.get('attn_types', 'L' * num)
        out_indices = check_stage_args(
            num, out_indices, attn_types, embed_dims=arch['embed_dims'],
            num_heads=arch['num_heads'], mlp_ratios=arch['mlp_ratios'], patch_sizes=patch_sizes,
            strides=strides, sr_ratios=sr_ratios)
        if any(k <= s for k, s in zip(patch_sizes, strides)):
            raise ValueError(f'overlapping embeddings need patch_sizes > strides, got '
                             f'{tuple(patch_sizes)} and {tuple(strides)}')
        if isinstance(pretrain_img_size, int):
            pretrain_img_size = (pretrain_img_size, pretrain_img_size)

        self.arch = arch
        self.embed_dims = list(arch['embed_dims'])
        self.depths = list(arch['depths'])
        self.out_indices = out_indices
        self.num_stages = num
        # plain numbers even under a torch.device('meta') context (cheap parameter counts)
        dpr = torch.linspace(0, drop_path_rate, sum(self.depths), device='cpu').tolist()

        grid = list(pretrain_img_size)
        prev = in_channels
        for i in range(num):
            grid = [_conv_out(g, patch_sizes[i], strides[i]) for g in grid]
            dims = self.embed_dims[i]
            # overlapping embedding (PVT v2 sec. 3.2): k//2 padding gives ceil(H/s) on its own;
            # its LayerNorm keeps the default epsilon, unlike the blocks
            setattr(self, f'patch_embed{i + 1}', PatchEmbed(
                prev, dims, patch_sizes[i], strides[i], padding=patch_sizes[i] // 2,
                pad_input=False))
            pe_grid = tuple(g // sr_ratios[i] for g in grid)
            start = sum(self.depths[:i])
            setattr(self, f'block{i + 1}', nn.ModuleList([
                FLattenPVTBlock(dims, arch['num_heads'][i], arch['mlp_ratios'][i],
                                attn_type=attn_types[i], pe_size=pe_grid, sr_ratio=sr_ratios[i],
                                qkv_bias=qkv_bias, focusing_factor=focusing_factor,
                                kernel_size=kernel_size, drop_rate=drop_rate,
                                drop_path=dpr[start + j], conv_mlp=True)
                for j in range(self.depths[i])
            ]))
            setattr(self, f'norm{i + 1}', LayerNormFP32(dims, eps=1e-6))
            prev = dims
        self._freeze_stages()

    def stage_modules(self, index):
        if index < 0:
            return [self.patch_embed1]
        stage = index + 1
        mods = [getattr(self, f'block{stage}'), getattr(self, f'norm{stage}')]
        if stage > 1:
            mods.append(getattr(self, f'patch_embed{stage}'))
        return mods

    def init_random_extras(self):
        """Official conv init: ``normal(0, sqrt(2 / fan_out))``, ``fan_out = k·k·out / groups``.

        mmengine's Kaiming rule ignores ``groups``, which matters for every depthwise conv here
        (MLP ``dwconv`` and attention ``dwc``), hence this explicit pass.
        """
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                nn.init.normal_(m.weight, 0, math.sqrt(2.0 / fan_out))
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x):
        outs = []
        for i in range(self.num_stages):
            x, hw = getattr(self, f'patch_embed{i + 1}')(x)
            for blk in getattr(self, f'block{i + 1}'):
                x = blk(x, hw)
            x = getattr(self, f'norm{i + 1}')(x)
            x = tokens_to_contiguous_map(x, hw)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)
