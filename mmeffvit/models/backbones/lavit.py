"""LaViT: Less-Attention Vision Transformer (Zhang et al., CVPR 2024, "You Only Need Less
Attention at Each Stage in Vision Transformers")."""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model.weight_init import trunc_normal_
from timm.layers import DropPath

from ...registry import MODELS, register_model
from ...utils import resize_token_grid, tokens_to_contiguous_map, unknown_choice_error
from ...utils.geometry_cache import GeometryCache
from ..layers import LayerNormFP32, PatchEmbed
from ..layers.attention_residual import AttentionResidualDownsample
from ..layers.less_attention import FactoredScores, LessAttention, VanillaAttention
from ..layers.linear import Mlp, mlp_residual
from ..layers.window import pad_to_windows, window_partition, window_reverse
from .base import EffBackbone, resolve_arch

_PVT = dict(embed_dims=[64, 128, 320, 512], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
            sr_ratios=[8, 4, 2, 1])
_LA_MODES = ('window', 'dense')
_CHAINS = ('previous', 'first')


class LaViTBlock(nn.Module):
    """Pre-norm block ``x + attn(norm1(x))``, ``x + mlp(norm2(x))`` with a VA or an LA attention.

    ``num_queries``/``num_keys`` size Θ/Ψ of an LA block (ignored for VA blocks).
    """

    def __init__(self, embed_dims, num_heads, mlp_ratio, sr_ratio, less_attention=False,
                 num_queries=None, num_keys=None, qkv_bias=True, theta_bias=True, psi_bias=False,
                 identity_init=True, drop_rate=0., attn_drop_rate=0., drop_path=0.,
                 norm_eps=1e-6):
        super().__init__()
        self.less_attention = less_attention
        self.norm1 = LayerNormFP32(embed_dims, eps=norm_eps)
        if less_attention:
            self.attn = LessAttention(embed_dims, num_heads, num_queries, num_keys, sr_ratio,
                                      qkv_bias=qkv_bias, theta_bias=theta_bias,
                                      psi_bias=psi_bias, identity_init=identity_init,
                                      attn_drop=attn_drop_rate, proj_drop=drop_rate)
        else:
            self.attn = VanillaAttention(embed_dims, num_heads, sr_ratio, qkv_bias=qkv_bias,
                                         attn_drop=attn_drop_rate, proj_drop=drop_rate)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = LayerNormFP32(embed_dims, eps=norm_eps)
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop=drop_rate)

    def forward(self, x, hw_shape, prev_scores=None, residual=None, key_mask=None,
                need_scores=True, factor_scores=False):
        """Returns the tokens, this layer's pre-softmax scores, probabilities and key grid
        (scores and probabilities None for a VA layer asked for no scores; ``factor_scores``:
        a VA layer may return its scores as factors, see :class:`FactoredScores`)."""
        if self.less_attention:
            y, scores, probs, k_hw = self.attn(self.norm1(x), hw_shape, prev_scores, key_mask)
        else:
            # a VA layer's probabilities feed nothing here (the loss reads LA layers')
            y, scores, probs, k_hw = self.attn(self.norm1(x), hw_shape, residual, key_mask,
                                               need_scores=need_scores, need_probs=False,
                                               factor_scores=factor_scores)
        x = x + self.drop_path(y)
        return (mlp_residual(x, self.norm2, self.mlp, self.drop_path, owned=True), scores, probs,
                k_hw)


def _windows(x, hw, win):
    """``(B, H*W, C)`` → zero-padded non-overlapping windows ``(B*nW, wh*ww, C)``."""
    b, _, c = x.shape
    grid = pad_to_windows(x.reshape(b, hw[0], hw[1], c), win)
    return window_partition(grid, win), (grid.shape[1] // win[0], grid.shape[2] // win[1])


def _unwindow(x, hw, win, n_win):
    grid = window_reverse(x, win, n_win[0] * win[0], n_win[1] * win[1])
    return grid[:, :hw[0], :hw[1]].reshape(grid.shape[0], hw[0] * hw[1], -1)


def square_maps(probs, q_hw, k_hw):
    """Pool the query grid of ``(B, H, Nq, Nk)`` maps onto the key grid → ``(B, H, Nk, Nk)``.

    Under spatial reduction the maps are not square, so transpose and diagonal (L_DP) are
    undefined; averaging the queries of each key cell keeps rows stochastic and makes entry
    ``(i, i)`` the attention of cell ``i``'s queries to their own reduced key.
    """
    b, h, nq, nk = probs.shape
    if nq == nk and tuple(q_hw) == tuple(k_hw):
        return probs
    grid = probs.transpose(-2, -1).reshape(b * h, nk, *q_hw)
    grid = F.adaptive_avg_pool2d(grid, k_hw)
    return grid.reshape(b, h, nk, nk).transpose(-2, -1)


@register_model
class LaViT(EffBackbone):
    """LaViT backbone (Zhang et al., CVPR 2024, sec. 3, Fig. 1; PVT layout, sec. 4.1).

    Each stage: patch embedding, learned position embedding, ``L^VA`` vanilla-attention (VA)
    layers (PVT spatial-reduction attention whose pre-softmax scores are stored, Eq. 4), then
    less-attention (LA) layers that compute no Q·K and transform the stored scores,
    ``A^l = Ψ(Θ(A^{l-1})ᵀ)ᵀ``, keeping V, the projection and the MLP (Eq. 5,
    :class:`LessAttention`). The last map of a stage enters the first layer of the next through
    :class:`AttentionResidualDownsample` (sec. 3.3). During training the softmax maps of all LA
    layers feed the diagonality-preserving loss (sec. 3.4); read it with :meth:`aux_losses`
    (the ``AuxLoss*`` detectors/segmentors add it to their loss dict as ``loss_diag``).

    The architecture is a reconstruction (the paper's Table 1 is not available and no code is
    public): PVT v1's layout (sec. 4.1), LA layers in stages 3-4 after one VA layer, PVT-S/M
    depths for ``small``/``base``, a narrower stage 4 for ``tiny``; every choice is an option.
    The reasoning, the parameter/MAC counts against the published ones and the other readings
    of the text are in ``configs/lavit/README.md`` ("Reconstruction notes").

    Any resolution (``la_mode``): Θ/Ψ are ``N×N`` maps of the training grid. ``'dense'`` is the
    paper's form, exact at ``pretrain_img_size`` and an error elsewhere; ``'window'`` (default)
    runs VA, LA and AR per window of the training grid from the first LA stage on (padded keys
    masked): the same weights, identical output at the training size, cost linear in the area.

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'`` (``t/s/b``) or a settings dict.
        in_channels (int): Input channels.
        pretrain_img_size (int | tuple): Training resolution (sizes Θ/Ψ and position tables).
        patch_sizes (tuple[int]): Patch size of each stage's embedding.
        la_mode (str): ``'window'`` (any size, linear cost) or ``'dense'`` (paper, fixed size).
        window_sizes (tuple | None): Token windows per stage for ``'window'``; None = the
            training grid of each stage.
        chain (str): What an LA layer transforms: ``'previous'`` layer's scores (Fig. 1) or the
            ``'first'`` map of the stage (the last VA layer's).
        attn_residual (bool): Use the AR modules between stages.
        ar_layer_scale_init (float): Initial LayerScale of the AR modules.
        theta_bias (bool): Bias of Θ.  psi_bias (bool): Bias of Ψ (dead under softmax).
        identity_init (bool): Θ/Ψ start as the identity.
        diag_loss (dict | None): Config of the loss on LA maps (e.g.
            ``dict(type='DiagonalityLoss', loss_weight=0.01)``); None disables it.
        qkv_bias (bool): Bias of q/kv/v.
        drop_rate, attn_drop_rate, drop_path_rate (float): Dropouts; stochastic depth grows
            linearly over all blocks.
        out_indices (Sequence[int]): Stages to output (0-based).
        final_norm (bool): Classification: a final LayerNorm ``norm`` (eps 1e-6) on the last
            stage (:class:`EffBackbone`). No LaViT code is public; PVT's classifier (norm, token
            mean, linear) is the assumed one.
        frozen_stages (int): See :class:`EffBackbone` (freezes the AR module into a stage too).
        norm_eval (bool): See :class:`EffBackbone`.
        init_cfg (dict | list, optional): Initialisation.

    Example:
        >>> import torch
        >>> from mmeffvit.models import LaViT
        >>> model = LaViT(arch='tiny').eval()
        >>> outs = model(torch.rand(1, 3, 333, 517))
        >>> [tuple(o.shape) for o in outs]
        [(1, 64, 84, 130), (1, 128, 42, 65), (1, 320, 21, 33), (1, 448, 11, 17)]
    """

    arch_settings = {
        'tiny': dict(_PVT, embed_dims=[64, 128, 320, 448], num_heads=[1, 2, 5, 7],
                     depths=[2, 2, 2, 2], num_va_layers=[2, 2, 1, 1]),
        'small': dict(_PVT, depths=[3, 4, 6, 3], num_va_layers=[3, 4, 1, 1]),
        'base': dict(_PVT, depths=[3, 4, 18, 3], num_va_layers=[3, 4, 1, 1]),
    }
    arch_aliases = {'t': 'tiny', 's': 'small', 'b': 'base'}
    # position tables are resized; Θ/Ψ cannot be: a checkpoint trained at another size is
    # rejected by the shape check of init_weights (keep pretrain_img_size, use la_mode='window')
    ckpt_drop_prefixes = ('head.', 'norm.')
    ckpt_resize_rules = ((r'^pos_embed\d+$', 'token_grid'), )
    final_norm_cfg = dict(eps=1e-6)  # as the blocks' norms (PVT layout, sec. 4.1)

    def __init__(self, arch='tiny', in_channels=3, pretrain_img_size=224, patch_sizes=(4, 2, 2, 2),
                 la_mode='window', window_sizes=None, chain='previous', attn_residual=True,
                 ar_layer_scale_init=1e-4, theta_bias=True, psi_bias=False, identity_init=True,
                 diag_loss=None, qkv_bias=True, drop_rate=0., attn_drop_rate=0.,
                 drop_path_rate=0.1, out_indices=(0, 1, 2, 3), final_norm=False, frozen_stages=-1,
                 norm_eval=False, init_cfg=None):
        super().__init__(frozen_stages=frozen_stages, norm_eval=norm_eval, init_cfg=init_cfg,
                         final_norm=final_norm)
        arch = resolve_arch(arch, self.arch_settings, self.arch_aliases,
                            required=('embed_dims', 'num_heads', 'mlp_ratios', 'depths'))
        num = len(arch['depths'])
        arch.setdefault('sr_ratios', [1] * num)
        arch.setdefault('num_va_layers', list(arch['depths']))
        for name in ('embed_dims', 'num_heads', 'mlp_ratios', 'sr_ratios', 'num_va_layers'):
            if len(arch[name]) != num:
                raise ValueError(f'arch {name} has {len(arch[name])} entries for {num} stages')
        if any(not 1 <= va <= d for va, d in zip(arch['num_va_layers'], arch['depths'])):
            raise ValueError('num_va_layers must be in 1..depth per stage (an LA layer needs a '
                             f"stored map), got {arch['num_va_layers']} for {arch['depths']}")
        if la_mode not in _LA_MODES:
            raise unknown_choice_error('la_mode', la_mode, _LA_MODES)
        if chain not in _CHAINS:
            raise unknown_choice_error('chain', chain, _CHAINS)
        if len(patch_sizes) != num:
            raise ValueError('patch_sizes needs one entry per stage')
        out_indices = tuple(out_indices)
        if not out_indices or any(not 0 <= i < num for i in out_indices):
            raise ValueError(f'out_indices must be a non-empty subset of 0..{num - 1}, '
                             f'got {out_indices}')
        if isinstance(pretrain_img_size, int):
            pretrain_img_size = (pretrain_img_size, pretrain_img_size)

        self.arch = arch
        self.embed_dims, self.depths = list(arch['embed_dims']), list(arch['depths'])
        self.num_heads, self.sr_ratios = list(arch['num_heads']), list(arch['sr_ratios'])
        self.num_va_layers = list(arch['num_va_layers'])
        self.out_indices, self.num_stages = out_indices, num
        self.la_mode, self.chain, self.attn_residual = la_mode, chain, attn_residual
        self.patch_sizes = tuple(patch_sizes)
        first_la = next((i for i in range(num) if self.num_va_layers[i] < self.depths[i]), num)
        self.windowed = [la_mode == 'window' and i >= first_la for i in range(num)]

        grid = list(pretrain_img_size)
        self.pos_grids, self.window_sizes = [], []
        dpr = torch.linspace(0, drop_path_rate, sum(self.depths)).tolist()
        prev = in_channels
        for i in range(num):
            grid = [-(-g // patch_sizes[i]) for g in grid]  # ceil, as the padding embedding
            self.pos_grids.append(tuple(grid))
            win = tuple(grid) if window_sizes is None or window_sizes[i] is None else (
                tuple(window_sizes[i]) if isinstance(window_sizes[i], (tuple, list))
                else (window_sizes[i], window_sizes[i]))
            self.window_sizes.append(win)
            sr = self.sr_ratios[i]
            attn_grid = win if self.windowed[i] else tuple(grid)
            if self.windowed[i] and (win[0] % sr or win[1] % sr):
                raise ValueError(f'stage {i + 1}: window {win} is not a multiple of sr {sr}')
            if self.windowed[i] and i > first_la and (
                    self.window_sizes[i - 1] != tuple(w * patch_sizes[i] for w in win)):
                raise ValueError(f'windows of stages {i} and {i + 1} must align: '
                                 f'{self.window_sizes[i - 1]} = {patch_sizes[i]} x {win}')
            nq, nk = attn_grid[0] * attn_grid[1], (attn_grid[0] // sr) * (attn_grid[1] // sr)
            dims = self.embed_dims[i]
            setattr(self, f'patch_embed{i + 1}', PatchEmbed(prev, dims, patch_sizes[i]))
            pos = nn.Parameter(torch.zeros(1, grid[0] * grid[1], dims))
            setattr(self, f'pos_embed{i + 1}', pos)
            setattr(self, f'pos_drop{i + 1}', nn.Dropout(drop_rate))
            start = sum(self.depths[:i])
            setattr(self, f'block{i + 1}', nn.ModuleList([
                LaViTBlock(dims, self.num_heads[i], arch['mlp_ratios'][i], sr,
                           less_attention=j >= self.num_va_layers[i], num_queries=nq,
                           num_keys=nk, qkv_bias=qkv_bias, theta_bias=theta_bias,
                           psi_bias=psi_bias, identity_init=identity_init, drop_rate=drop_rate,
                           attn_drop_rate=attn_drop_rate, drop_path=dpr[start + j])
                for j in range(self.depths[i])]))
            if i > 0 and attn_residual:
                setattr(self, f'attn_residual{i + 1}', AttentionResidualDownsample(
                    self.num_heads[i - 1], self.num_heads[i], kernel_size=patch_sizes[i],
                    stride=patch_sizes[i],
                    key_stride=max(1, sr * patch_sizes[i] // self.sr_ratios[i - 1]),
                    layer_scale_init=ar_layer_scale_init))
            prev = dims
        if isinstance(diag_loss, dict):
            diag_loss = dict(diag_loss)
            diag_loss.setdefault('input_type', 'probs')  # LA layers already hold softmax maps
            diag_loss = MODELS.build(diag_loss)
        self.diag_loss = diag_loss
        self._aux = {}
        self.add_final_norm(self.embed_dims[-1])
        self._mask_cache = GeometryCache(maxsize=16)  # run-time, not state
        self._freeze_stages()

    def stage_modules(self, index):
        if index < 0:
            return [self.patch_embed1, self.pos_embed1]
        s = index + 1
        mods = [getattr(self, f'block{s}'), getattr(self, f'pos_embed{s}')]
        if s > 1:
            mods += [getattr(self, f'patch_embed{s}'), getattr(self, f'attn_residual{s}', None)]
        return mods

    def init_random_extras(self):
        for i in range(self.num_stages):
            trunc_normal_(getattr(self, f'pos_embed{i + 1}'), std=.02)
        for m in self.modules():
            if isinstance(m, LessAttention):
                m.reset_transforms()

    def aux_losses(self):
        """Auxiliary losses of the last training forward (``{'loss_diag': ...}``), then cleared."""
        aux, self._aux = self._aux, {}
        return aux

    def _residual(self, i, carry, hw, n_win):
        """AR residual for the first layer of stage ``i`` from the last map of stage ``i-1``."""
        ar = getattr(self, f'attn_residual{i + 1}', None)
        if ar is None or carry is None:
            return None
        sr = self.sr_ratios[i]
        if not self.windowed[i]:
            scores = carry['scores']
            if (isinstance(scores, FactoredScores) and self.num_va_layers[i] == 1
                    and self.depths[i] > 1):
                # LA layers read the first layer's scores: a map either way; made from the map,
                # the residual has the window path's sums (modes agree at the training size)
                scores = scores.dense()
            k_hw = (hw[0] // sr, hw[1] // sr) if sr > 1 else tuple(hw)
            return ar(scores, carry['q_hw'], carry['k_hw'], out_k_hw=k_hw)
        win = self.window_sizes[i]
        k_win = (win[0] // sr, win[1] // sr)
        if self.windowed[i - 1]:   # aligned windows: window (a, b) feeds window (a, b)
            return ar(carry['scores'], carry['q_hw'], carry['k_hw'], out_k_hw=k_win)
        # global map into windows: only its window-diagonal blocks are read (linear cost)
        return ar.forward_windows(carry['scores'], carry['q_hw'], carry['k_hw'], n_win, win,
                                  k_win)

    def _key_mask(self, i, hw, n_win, batch, device):
        """True for key cells of a window that hold no real token (padding only).

        Decided on integers (no host sync) and cached per shape and device.
        """
        sr, win = self.sr_ratios[i], self.window_sizes[i]
        kh, kw = win[0] // sr, win[1] // sr
        if (n_win[0] * kh - 1) * sr < hw[0] and (n_win[1] * kw - 1) * sr < hw[1]:
            return None

        def build():  # on the host: a table of the geometry alone
            rows = np.arange(n_win[0] * kh) * sr < hw[0]
            cols = np.arange(n_win[1] * kw) * sr < hw[1]
            valid = (rows[:, None] & cols[None, :]).reshape(n_win[0], kh, n_win[1], kw)
            valid = valid.transpose(0, 2, 1, 3).reshape(n_win[0] * n_win[1], 1, 1, kh * kw)
            padding = np.ascontiguousarray(np.tile(~valid, (batch, 1, 1, 1)))
            return torch.from_numpy(padding).to(device)
        return self._mask_cache((i, tuple(hw), tuple(n_win), batch, device), build)

    def _stage(self, i, x, hw, carry, la_maps):
        b = x.shape[0]
        n_win = None
        grid, mask = tuple(hw), None
        if self.windowed[i]:
            grid = self.window_sizes[i]
            x, n_win = _windows(x, hw, grid)
            mask = self._key_mask(i, hw, n_win, b, x.device)
        residual = self._residual(i, carry, hw, n_win)
        first = prev = None
        # only the last VA layer's scores are read: by the LA layers, or by the next AR module
        nva = self.num_va_layers[i]
        next_ar = hasattr(self, f'attn_residual{i + 2}')
        scores_read = nva < self.depths[i] or next_ar
        # read by the next AR module only: the scores may stay factored (never written)
        factor = nva == self.depths[i] and next_ar
        for j, blk in enumerate(getattr(self, f'block{i + 1}')):
            source = first if self.chain == 'first' else prev
            x, scores, probs, k_hw = blk(x, grid, prev_scores=source,
                                         residual=residual if j == 0 else None, key_mask=mask,
                                         need_scores=j >= nva - 1 and scores_read,
                                         factor_scores=factor)
            if j == self.num_va_layers[i] - 1:
                first = scores
            prev = scores
            if blk.less_attention and la_maps is not None:
                # the loss reads probabilities unless it was asked for logits / raw scores
                use_probs = getattr(self.diag_loss, 'input_type', 'probs') == 'probs'
                la_maps.append(square_maps(probs if use_probs else scores, grid, k_hw))
        if n_win is not None:
            x = _unwindow(x, hw, grid, n_win)
        return x, dict(scores=prev, q_hw=tuple(grid), k_hw=k_hw)

    def forward(self, x):
        # A stage's k=s=sr reduction conv needs >= sr tokens a side, i.e. inputs of at least
        # stride*sr pixels (32 for t/s/b): smaller ones are zero-padded at the bottom/right, as
        # mmdet/mmseg pad batches, and each output is cropped back to ceil(size / stride).
        in_hw = x.shape[-2:]
        strides = [math.prod(self.patch_sizes[:i + 1]) for i in range(self.num_stages)]
        min_side = max(s * sr for s, sr in zip(strides, self.sr_ratios))
        if min(in_hw) < min_side:
            x = F.pad(x, (0, max(min_side - in_hw[1], 0), 0, max(min_side - in_hw[0], 0)))
        outs, carry = [], None
        collect = self.diag_loss is not None and self.training and torch.is_grad_enabled()
        la_maps = [] if collect else None
        for i in range(self.num_stages):
            x, hw = getattr(self, f'patch_embed{i + 1}')(x)
            pos = resize_token_grid(getattr(self, f'pos_embed{i + 1}'), self.pos_grids[i], hw,
                                    mode='bilinear')
            x = getattr(self, f'pos_drop{i + 1}')(x + pos)
            x, carry = self._stage(i, x, hw, carry, la_maps)
            x = tokens_to_contiguous_map(x, hw)
            if i in self.out_indices:
                outs.append(x[..., :-(-in_hw[0] // strides[i]), :-(-in_hw[1] // strides[i])])
        self._aux = {}
        if collect and la_maps:
            self._aux[getattr(self.diag_loss, 'loss_name', 'loss_diag')] = self.diag_loss(
                la_maps)
        return tuple(outs)
