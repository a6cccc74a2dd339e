"""FLatten-PVT: PVT (v1) with focused linear attention (FLatten Transformer, ICCV 2023, sec. 5)."""
import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_

from ...registry import register_model
from ...utils import TokenGridResizeCache, tokens_to_contiguous_map
from ..layers import FLattenPVTBlock, PatchEmbed
from .base import EffBackbone, check_stage_args, resolve_arch

# widths shared by every FLatten-PVT variant (official flatten_pvt_* factories)
_PVT_WIDTHS = dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4])


@register_model
class FLattenPVT(EffBackbone):
    """FLatten-PVT backbone (FLatten Transformer, Han et al., ICCV 2023, sec. 5.1, Table 2).

    PVT v1 (four stages of non-overlapping patch embeddings, learnable absolute position
    embeddings per stage) with focused linear attention in every block (``attn_types='LLLL'``,
    no spatial reduction: the released configuration). Parameter names follow the official code
    (``patch_embed{i}``, ``pos_embed{i}``, ``block{i}.{j}.attn.q/kv/proj/scale/
    positional_encoding/dwc``) so the official ImageNet checkpoints load directly.

    Dense prediction: any input size works. Position embeddings are stored for
    ``pretrain_img_size`` and resized bilinearly to each stage's runtime grid (as the official
    forward does), each attention's positional encoding likewise (see
    :class:`FocusedLinearAttention`). The classification-only final ``norm`` and ``head`` are
    not built; outputs are the stage maps ``(B, C_i, H/4·2^i, W/4·2^i)`` selected by
    ``out_indices``.

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'medium'``, ``'large'`` (or ``t/s/m/l``),
            or a dict with ``embed_dims``, ``num_heads``, ``mlp_ratios``, ``depths`` and
            optionally ``sr_ratios``, ``attn_types``.
        in_channels (int): Input channels.
        pretrain_img_size (int | tuple): Resolution the position tensors are stored for.
        patch_sizes (tuple[int]): Patch size of each stage's embedding.
        qkv_bias (bool): Bias of q/k/v projections.
        focusing_factor (float): Focusing power p.
        kernel_size (int): Kernel of the rank-restoring depthwise conv.
        drop_rate (float): Dropout rate.
        drop_path_rate (float): Stochastic depth, increasing linearly over all blocks.
        out_indices (Sequence[int]): Stages to output (0-based).
        frozen_stages (int): See :class:`EffBackbone`.
        norm_eval (bool): See :class:`EffBackbone`.
        init_cfg (dict | list, optional): Initialisation; ``dict(type='Pretrained',
            checkpoint=...)`` loads official or OpenMMLab checkpoints.

    Example:
        >>> import torch
        >>> from mmeffvit.models import FLattenPVT
        >>> model = FLattenPVT(arch='tiny').eval()
        >>> outs = model(torch.rand(1, 3, 333, 517))
        >>> [tuple(o.shape) for o in outs]
        [(1, 64, 84, 130), (1, 128, 42, 65), (1, 320, 21, 33), (1, 512, 11, 17)]
    """

    arch_settings = {
        'tiny': dict(_PVT_WIDTHS, depths=[2, 2, 2, 2]),
        'small': dict(_PVT_WIDTHS, depths=[3, 4, 6, 3]),
        'medium': dict(_PVT_WIDTHS, depths=[3, 4, 18, 3]),
        'large': dict(_PVT_WIDTHS, depths=[3, 8, 27, 3]),
    }
    arch_aliases = {'t': 'tiny', 's': 'small', 'm': 'medium', 'l': 'large', 'b': 'large'}
    # official files hold the classifier (head, unused final norm); position tensors are
    # resized to pretrain_img_size; the original PVT v1 keeps a cls slot in pos_embed4
    ckpt_drop_prefixes = ('head.', 'norm.')
    ckpt_resize_rules = ((r'^pos_embed\d+$', 'token_grid', dict(ckpt_prefix=(1, ))),
                         (r'\.positional_encoding$', 'token_grid'))

    def __init__(self,
                 arch='tiny',
                 in_channels=3,
                 pretrain_img_size=224,
                 patch_sizes=(4, 2, 2, 2),
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
            sr_ratios=sr_ratios)
        if isinstance(pretrain_img_size, int):
            pretrain_img_size = (pretrain_img_size, pretrain_img_size)

        self.arch = arch
        self.embed_dims = list(arch['embed_dims'])
        self.depths = list(arch['depths'])
        self.out_indices = out_indices
        self.num_stages = num
        dpr = torch.linspace(0, drop_path_rate, sum(self.depths)).tolist()

        grid = list(pretrain_img_size)
        self.pos_grids = []
        self._pos_resized = []
        prev = in_channels
        for i in range(num):
            grid = [g // patch_sizes[i] for g in grid]
            self.pos_grids.append(tuple(grid))
            dims = self.embed_dims[i]
            setattr(self, f'patch_embed{i + 1}', PatchEmbed(prev, dims, patch_sizes[i]))
            pos = nn.Parameter(torch.zeros(1, grid[0] * grid[1], dims))
            setattr(self, f'pos_embed{i + 1}', pos)
            self._pos_resized.append(TokenGridResizeCache())
            setattr(self, f'pos_drop{i + 1}', nn.Dropout(drop_rate))
            # keys are reduced by sr for 'L' blocks too, so their encoding lives on that grid
            pe_grid = tuple(g // sr_ratios[i] for g in grid)
            start = sum(self.depths[:i])
            setattr(self, f'block{i + 1}', nn.ModuleList([
                FLattenPVTBlock(dims, arch['num_heads'][i], arch['mlp_ratios'][i],
                                attn_type=attn_types[i], pe_size=pe_grid, sr_ratio=sr_ratios[i],
                                qkv_bias=qkv_bias, focusing_factor=focusing_factor,
                                kernel_size=kernel_size, drop_rate=drop_rate,
                                drop_path=dpr[start + j]) for j in range(self.depths[i])
            ]))
            prev = dims
        self._freeze_stages()

    def stage_modules(self, index):
        if index < 0:
            return [self.patch_embed1, self.pos_embed1]
        stage = index + 1
        mods = [getattr(self, f'block{stage}'), getattr(self, f'pos_embed{stage}')]
        if stage > 1:
            mods.append(getattr(self, f'patch_embed{stage}'))
        return mods

    def init_random_extras(self):
        for i in range(self.num_stages):
            trunc_normal_(getattr(self, f'pos_embed{i + 1}'), std=.02)

    def forward(self, x):
        outs = []
        for i in range(self.num_stages):
            x, hw = getattr(self, f'patch_embed{i + 1}')(x)
            pos = self._pos_resized[i](getattr(self, f'pos_embed{i + 1}'), self.pos_grids[i], hw,
                                       mode='bilinear')
            x = getattr(self, f'pos_drop{i + 1}')(x + pos)
            for blk in getattr(self, f'block{i + 1}'):
                x = blk(x, hw)
            x = tokens_to_contiguous_map(x, hw)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)
