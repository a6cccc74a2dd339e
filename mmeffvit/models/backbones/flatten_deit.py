"""FLatten-DeiT: DeiT with focused linear attention (FLatten Transformer, ICCV 2023, Table 3)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model.weight_init import trunc_normal_
from timm.layers import DropPath, LayerNorm2d, PatchEmbed

from ...registry import register_model
from ... import ops
from ...utils import resize_token_grid, tokens_to_contiguous_map, unknown_choice_error
from ..layers import FocusedLinearAttention, LayerNormFP32
from ..layers.linear import Mlp, mlp_residual
from .base import EffBackbone, resolve_arch

_CLS_MODES = ('full', 'query')
_OUT_TYPES = ('cls_token', 'featmap', 'avg_featmap', 'raw')


class ClsFocusedLinearAttention(FocusedLinearAttention):
    """Focused linear attention over ``[prefix tokens; H×W patch grid]`` (e.g. DeiT's cls token).

    Same parameters and names as :class:`FocusedLinearAttention` with ``qkv_layout='qkv'``
    (``qkv``, ``proj``, ``scale``, ``positional_encoding``, ``dwc``); the focusing map and the
    linear-attention core are the shared functions. What the grid-only module cannot express is
    how the prefix tokens take part, hence this wrapper:

    * the positional encoding covers the patch grid only (no slot for the prefix tokens), so it
      is stored and resized like every other FLatten encoding;
    * the rank-restoring DWC runs on the patch grid only and is added to patch tokens only, the
      prefix outputs come from linear attention alone (as the same group's Agent-Attention DeiT
      treats its cls token);
    * ``cls_attention='full'``: prefix tokens are queries **and** keys/values (every token
      attends to the cls token, as in softmax DeiT); ``'query'``: prefix tokens only query the
      patches, so the patch outputs equal grid-only FLatten attention.

    Args:
        embed_dims (int): Channels C.
        num_heads (int): Heads h.
        pe_size (tuple[int, int] | None): Patch grid the positional encoding is stored for.
        cls_attention (str): ``'full'`` or ``'query'`` (see above).
        **kwargs: ``qkv_bias``, ``focusing_factor``, ``kernel_size``, ``proj_drop``,
            ``pe_interpolation`` of :class:`FocusedLinearAttention`.
    """

    def __init__(self, embed_dims, num_heads, pe_size=None, cls_attention='full', **kwargs):
        super().__init__(embed_dims, num_heads, pe_size=pe_size, qkv_layout='qkv', **kwargs)
        if cls_attention not in _CLS_MODES:
            raise unknown_choice_error('cls_attention', cls_attention, _CLS_MODES)
        self.cls_attention = cls_attention

    def forward(self, x, hw_shape):
        """Args: x ``(B, P + H*W, C)``, prefix tokens first; hw_shape ``(H, W)``."""
        b, n, c = x.shape
        grid = hw_shape[0] * hw_shape[1]
        num_prefix = n - grid
        if num_prefix < 0:
            raise ValueError(f'{n} tokens cannot hold the {tuple(hw_shape)} patch grid')
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.positional_encoding is not None:
            pe = resize_token_grid(self.positional_encoding, self.pe_size, hw_shape,
                                   self.pe_interpolation)
            k = k + F.pad(pe, (0, 0, num_prefix, 0))  # zeros for the prefix tokens
        k_att, v_att = (k, v) if self.cls_attention == 'full' else (
            k[:, num_prefix:], v[:, num_prefix:])
        h, d = self.num_heads, self.head_dims

        def heads(t):
            return t.reshape(b, -1, h, d).transpose(1, 2)

        # as in FocusedLinearAttention.attend: powers and sums in fp32 under autocast, one
        # fused operator (or its reference)
        with torch.autocast(device_type=x.device.type, enabled=False):
            out = ops.focused_linear_attention(q, k_att, v_att, self.scale, h,
                                               self.focusing_factor)

        # DWC on the patch grid, one kernel set shared by the heads; prefix rows get nothing
        v_grid = heads(v[:, num_prefix:]).reshape(b * h, *hw_shape, d).permute(0, 3, 1, 2)
        dwc = self.dwc(v_grid).reshape(b, h, d, grid).permute(0, 3, 1, 2).reshape(b, grid, c)
        out = out + F.pad(dwc, (0, 0, num_prefix, 0)).to(out.dtype)
        return self.proj_drop(self.proj(out))


class FLattenDeiTBlock(nn.Module):
    """Pre-norm ViT block (timm names ``norm1``, ``attn``, ``norm2``, ``mlp.fc1/fc2``)."""

    def __init__(self, embed_dims, num_heads, mlp_ratio, pe_size, cls_attention='full',
                 qkv_bias=True, focusing_factor=3, kernel_size=5, drop_rate=0., drop_path=0.,
                 norm_eps=1e-6):
        super().__init__()
        self.norm1 = LayerNormFP32(embed_dims, eps=norm_eps)
        self.attn = ClsFocusedLinearAttention(
            embed_dims, num_heads, pe_size=pe_size, cls_attention=cls_attention,
            qkv_bias=qkv_bias, focusing_factor=focusing_factor, kernel_size=kernel_size,
            proj_drop=drop_rate)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = LayerNormFP32(embed_dims, eps=norm_eps)
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop=drop_rate)

    def forward(self, x, hw_shape):
        x = x + self.drop_path(self.attn(self.norm1(x), hw_shape))
        return mlp_residual(x, self.norm2, self.mlp, self.drop_path, owned=True)


def simple_pyramid(embed_dims):
    """ViTDet's simple feature pyramid (Li et al., ECCV 2022, sec. 3) from one stride-16 map.

    Stride 4: two 2× deconvs with LayerNorm + GELU between (C → C/2 → C/4); stride 8: one
    deconv (C → C/2); stride 16: identity; stride 32: 2×2 max-pool (ceil mode, so odd maps keep
    their last row/column).
    """
    half, quarter = embed_dims // 2, embed_dims // 4
    return nn.ModuleList([
        nn.Sequential(nn.ConvTranspose2d(embed_dims, half, 2, stride=2), LayerNorm2d(half),
                      nn.GELU(), nn.ConvTranspose2d(half, quarter, 2, stride=2)),
        nn.ConvTranspose2d(embed_dims, half, 2, stride=2),
        nn.Identity(),
        nn.MaxPool2d(2, stride=2, ceil_mode=True),
    ])


@register_model
class FLattenDeiT(EffBackbone):
    """FLatten-DeiT backbone (FLatten Transformer, Han et al., ICCV 2023, sec. 5.1, Table 3).

    DeiT (Touvron et al., ICML 2021): 16×16 patches, a cls token, a learned absolute position
    embedding, 12 pre-norm blocks; every block's softmax attention is replaced by focused linear
    attention (sec. 4). No official FLatten-DeiT code exists, so the following are choices:

    * the cls token takes part in the linear attention as query and key/value, but has no
      positional-encoding slot and no DWC term (encoding and DWC live on the patch grid). This
      follows the same group's Agent-Attention DeiT; ``cls_attention='query'`` keeps the cls
      token out of the keys instead (see :class:`ClsFocusedLinearAttention`).
    * parameter names are timm's ``VisionTransformer`` (``patch_embed.proj``, ``cls_token``,
      ``pos_embed``, ``blocks.{i}.norm1/attn.qkv/attn.proj/norm2/mlp.fc1/mlp.fc2``, ``norm``)
      plus FLatten's ``blocks.{i}.attn.scale/positional_encoding/dwc``, so a DeiT checkpoint
      (timm or facebookresearch layout) loads everything except those FLA parameters.

    Outputs (mmpretrain's ``VisionTransformer`` conventions): for each block in ``out_indices``
    either the cls token ``(B, C)`` (``out_type='cls_token'``), the patch map
    ``(B, C, ⌈H/16⌉, ⌈W/16⌉)`` (``'featmap'``), the mean patch token (``'avg_featmap'``) or all
    tokens (``'raw'``). The final ``norm`` is applied to the last block's output only
    (``final_norm``). Blocks after the last requested one are not run. With ``with_pyramid=True``
    (dense prediction, one out index, ``'featmap'``) the map of that block becomes a ViTDet
    simple pyramid of strides 4, 8, 16, 32 with ``C/4, C/2, C, C`` channels, so an FPN can follow.

    Any input size works: inputs are zero-padded at the bottom/right to multiples of the patch
    size; ``pos_embed`` (stored for ``pretrain_img_size``) and each attention's positional
    encoding are resized (bicubic) to the runtime grid.

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'`` (or ``t/s/b``,
            ``deit-tiny`` ...), or a dict with ``embed_dims``, ``num_heads``, ``depth`` and
            optionally ``mlp_ratio``.
        in_channels (int): Input channels.
        pretrain_img_size (int | tuple): Resolution the position tensors are stored for.
        patch_size (int): Patch size.
        qkv_bias (bool): Bias of the fused qkv projection (True in DeiT).
        cls_attention (str): ``'full'`` (default) or ``'query'``, see above.
        focusing_factor (float): Focusing power p.
        kernel_size (int): Kernel of the rank-restoring depthwise conv.
        drop_rate (float): Dropout rate (also after the position embedding).
        drop_path_rate (float): Stochastic depth, increasing linearly over the blocks (DeiT 0.1).
        out_indices (int | Sequence[int]): Blocks to output (negative counts from the end).
        out_type (str): ``'cls_token'``, ``'featmap'``, ``'avg_featmap'`` or ``'raw'``.
        final_norm (bool): Build ``norm`` and apply it to the last block's output.
        with_pyramid (bool): Turn the single ``'featmap'`` output into four pyramid levels.
        frozen_stages (int): Freeze the stem (patch embedding, cls token, ``pos_embed``) and
            the first ``frozen_stages`` blocks (``depth`` also freezes ``norm``).
        norm_eval (bool): See :class:`EffBackbone`.
        init_cfg (dict | list, optional): Initialisation; ``dict(type='Pretrained',
            checkpoint=...)`` loads DeiT / FLatten-DeiT checkpoints.

    Example:
        >>> import torch
        >>> from mmeffvit.models import FLattenDeiT
        >>> model = FLattenDeiT('tiny', out_indices=(3, 11), out_type='featmap').eval()
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 333, 517))]
        [(1, 192, 21, 33), (1, 192, 21, 33)]
        >>> model = FLattenDeiT('tiny', out_type='featmap', with_pyramid=True).eval()
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 333, 517))]
        [(1, 48, 84, 132), (1, 96, 42, 66), (1, 192, 21, 33), (1, 192, 11, 17)]
    """

    arch_settings = {
        'tiny': dict(embed_dims=192, num_heads=3, depth=12, mlp_ratio=4.),
        'small': dict(embed_dims=384, num_heads=6, depth=12, mlp_ratio=4.),
        'base': dict(embed_dims=768, num_heads=12, depth=12, mlp_ratio=4.),
    }
    arch_aliases = {'t': 'tiny', 's': 'small', 'b': 'base', 'deit-tiny': 'tiny',
                    'deit-small': 'small', 'deit-base': 'base'}
    num_extra_tokens = 1
    # DeiT / distilled DeiT files: heads and the distillation token go, pos_embed keeps its cls
    # slot, position tensors are resized to pretrain_img_size
    ckpt_drop_prefixes = ('head.', 'head_dist.', 'dist_token')
    ckpt_resize_rules = ((r'^pos_embed$', 'token_grid', dict(ckpt_prefix=(1, 2))),
                         (r'\.positional_encoding$', 'token_grid'))

    def __init__(self,
                 arch='tiny',
                 in_channels=3,
                 pretrain_img_size=224,
                 patch_size=16,
                 qkv_bias=True,
                 cls_attention='full',
                 focusing_factor=3,
                 kernel_size=5,
                 drop_rate=0.,
                 drop_path_rate=0.1,
                 out_indices=-1,
                 out_type='cls_token',
                 final_norm=True,
                 with_pyramid=False,
                 frozen_stages=-1,
                 norm_eval=False,
                 init_cfg=None):
        super().__init__(frozen_stages=frozen_stages, norm_eval=norm_eval, init_cfg=init_cfg)
        arch = resolve_arch(arch, self.arch_settings, self.arch_aliases,
                            required=('embed_dims', 'num_heads', 'depth'))
        depth, dims = arch['depth'], arch['embed_dims']
        if out_type not in _OUT_TYPES:
            raise unknown_choice_error('out_type', out_type, _OUT_TYPES)
        if isinstance(out_indices, int):
            out_indices = (out_indices, )
        if not len(out_indices) or any(not -depth <= i < depth for i in out_indices):
            raise ValueError(f'out_indices must be non-empty block indices in '
                             f'[-{depth}, {depth - 1}], got {tuple(out_indices)}')
        out_indices = tuple(sorted({i % depth for i in out_indices}))
        if with_pyramid and (out_type != 'featmap' or len(out_indices) != 1):
            raise ValueError("with_pyramid=True builds four levels from one block's map: use "
                             f"out_type='featmap' and one out index, got {out_type!r}, "
                             f'{out_indices}')
        if isinstance(pretrain_img_size, int):
            pretrain_img_size = (pretrain_img_size, pretrain_img_size)

        self.arch = arch
        self.embed_dims = dims
        self.depth = self.num_stages = depth  # frozen_stages counts blocks
        self.patch_size = patch_size
        self.out_indices = out_indices
        self.out_type = out_type
        self.final_norm = final_norm
        self.with_pyramid = with_pyramid
        self.pos_grid = tuple(s // patch_size for s in pretrain_img_size)

        self.patch_embed = PatchEmbed(img_size=None, patch_size=patch_size, in_chans=in_channels,
                                      embed_dim=dims, flatten=False, dynamic_img_pad=True)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dims))
        num_pos = self.pos_grid[0] * self.pos_grid[1] + self.num_extra_tokens
        self.pos_embed = nn.Parameter(torch.zeros(1, num_pos, dims))
        self.pos_drop = nn.Dropout(drop_rate)
        # plain numbers even under a torch.device('meta') context (cheap parameter counts)
        dpr = torch.linspace(0, drop_path_rate, depth, device='cpu').tolist()
        self.blocks = nn.ModuleList([
            FLattenDeiTBlock(dims, arch['num_heads'], arch.get('mlp_ratio', 4.),
                             pe_size=self.pos_grid, cls_attention=cls_attention,
                             qkv_bias=qkv_bias, focusing_factor=focusing_factor,
                             kernel_size=kernel_size, drop_rate=drop_rate, drop_path=dpr[i])
            for i in range(depth)
        ])
        self.norm = LayerNormFP32(dims, eps=1e-6) if final_norm else None
        if with_pyramid:
            self.pyramid = simple_pyramid(dims)
            self.out_channels = [dims // 4, dims // 2, dims, dims]
        else:
            self.pyramid = None
            self.out_channels = [dims] * len(out_indices)
        self._freeze_stages()

    def stage_modules(self, index):
        if index < 0:
            return [self.patch_embed, self.cls_token, self.pos_embed]
        mods = [self.blocks[index]]
        if index == self.depth - 1:
            mods.append(self.norm)
        return mods

    def init_random_extras(self):
        # DeiT's init of the two free tensors (Linear / LayerNorm come from init_cfg)
        trunc_normal_(self.pos_embed, std=.02)
        trunc_normal_(self.cls_token, std=.02)

    def _pos_embed(self, hw):
        pos = self.pos_embed
        grid = resize_token_grid(pos[:, self.num_extra_tokens:], self.pos_grid, hw,
                                 mode='bicubic')
        return torch.cat([pos[:, :self.num_extra_tokens], grid], dim=1)

    def _format(self, x, hw, last):
        if last and self.norm is not None:
            x = self.norm(x)
        if self.out_type == 'raw':
            return x
        if self.out_type == 'cls_token':
            return x[:, 0]
        patches = x[:, self.num_extra_tokens:]
        if self.out_type == 'avg_featmap':
            return patches.mean(dim=1)
        return tokens_to_contiguous_map(patches, hw)

    def forward(self, x):
        x = self.patch_embed(x)  # pads to patch multiples (bottom/right)
        hw = (int(x.shape[-2]), int(x.shape[-1]))
        x = x.flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pos_drop(x + self._pos_embed(hw))
        outs = []
        for i, blk in enumerate(self.blocks[:self.out_indices[-1] + 1]):
            x = blk(x, hw)
            if i in self.out_indices:
                outs.append(self._format(x, hw, last=i == self.depth - 1))
        if self.pyramid is not None:
            return tuple(level(outs[-1]) for level in self.pyramid)
        return tuple(outs)
