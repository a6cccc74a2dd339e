"""Attention-residual (AR) downsampling of LaViT (Zhang et al., CVPR 2024, sec. 3.3, Eq. 6-7)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from ...registry import register_model


def fit_key_grid(attn, k_hw, out_k_hw):
    """Crop or zero-pad the key grid of ``attn (B, H, Nq, Hk*Wk)`` to ``out_k_hw``.

    Two stages' key grids can differ by one cell on odd inputs (each stage's reduction conv
    drops its own remainder); a zero residual on the missing cell is the neutral choice.
    """
    k_hw, out_k_hw = tuple(k_hw), tuple(out_k_hw)
    if k_hw == out_k_hw:
        return attn
    b, h, nq, _ = attn.shape
    grid = attn.reshape(b, h, nq, *k_hw)[..., :out_k_hw[0], :out_k_hw[1]]
    grid = F.pad(grid, (0, out_k_hw[1] - grid.shape[-1], 0, out_k_hw[0] - grid.shape[-2]))
    return grid.reshape(b, h, nq, out_k_hw[0] * out_k_hw[1])


@register_model
class AttentionResidualDownsample(BaseModule):
    """Carries the last attention map of stage ``s`` into the first layer of stage ``s+1``.

    Sec. 3.3 (Eq. 6): ``Ã = LS(Conv1x1(DWConv(A_last)))``, added to the pre-softmax scores of
    the next stage's first (vanilla) attention layer. The map is treated as an image whose
    channels are the heads: for each key, the attention column over the *query grid* is a
    ``Hq×Wq`` image, downsampled by a depthwise ``k=s=2`` conv (the 2×2 token merge of the
    next patch embedding; not a stride over the flattened ``N×N`` matrix, which would merge
    raster strips). The 1×1 conv then exchanges information across heads
    (``in_heads → out_heads``) and LayerScale (CaiT) scales each output head by a learnable
    ``γ`` initialised small, so the residual starts almost neutral.

    With PVT spatial reduction the key grid is the same in every stage (``H/32×W/32``), so by
    default only queries are downsampled; ``key_stride > 1`` also average-pools the key grid
    (for backbones without spatial reduction). No weight depends on the token count, so the
    module runs at any resolution; odd query grids are zero-padded (bottom/right), matching
    the ``ceil`` token grid of a padding patch embedding.

    Args:
        in_heads (int): Heads of stage ``s`` (input channels).
        out_heads (int): Heads of stage ``s+1``.
        kernel_size (int): Depthwise kernel on the query grid.
        stride (int): Its stride (2 for a 2×2 patch merge).
        key_stride (int): Average-pooling factor of the key grid (1 = keep).
        layer_scale_init (float | None): Initial ``γ``; None disables LayerScale.
        init_cfg (dict, optional): Initialisation config.

    Example:
        >>> import torch
        >>> ar = AttentionResidualDownsample(2, 5)
        >>> attn = torch.randn(1, 2, 28 * 28, 49)
        >>> ar(attn, (28, 28), (7, 7)).shape
        torch.Size([1, 5, 196, 49])
    """

    def __init__(self, in_heads, out_heads, kernel_size=2, stride=2, key_stride=1,
                 layer_scale_init=1e-4, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        if min(in_heads, out_heads, kernel_size, stride, key_stride) < 1:
            raise ValueError('heads, kernel_size, stride and key_stride must be positive')
        if kernel_size < stride:
            raise ValueError(f'kernel_size {kernel_size} < stride {stride} would skip tokens')
        self.in_heads, self.out_heads = in_heads, out_heads
        self.stride, self.key_stride = stride, key_stride
        self.dwconv = nn.Conv2d(in_heads, in_heads, kernel_size, stride=stride, groups=in_heads)
        self.pwconv = nn.Conv2d(in_heads, out_heads, 1)
        self.gamma = (nn.Parameter(torch.full((out_heads, ), float(layer_scale_init)))
                      if layer_scale_init is not None else None)

    def out_grid(self, q_hw):
        """Query grid after downsampling (``ceil``, as the padding patch embedding)."""
        return tuple(-(-s // self.stride) for s in q_hw)

    def forward(self, attn, q_hw, k_hw, out_k_hw=None):
        """Args:
            attn (Tensor): ``(B, in_heads, Hq*Wq, Hk*Wk)`` scores of stage ``s``.
            q_hw, k_hw (tuple[int]): Query and key grids.
            out_k_hw (tuple[int], optional): Key grid of stage ``s+1`` (crop/zero-pad to it).

        Returns:
            Tensor: ``(B, out_heads, Hq'*Wq', Hk'*Wk')`` residual scores.
        """
        b, h, nq, nk = attn.shape
        if h != self.in_heads or nq != q_hw[0] * q_hw[1] or nk != k_hw[0] * k_hw[1]:
            raise ValueError(f'attention {tuple(attn.shape)} does not match in_heads='
                             f'{self.in_heads}, q_hw={tuple(q_hw)}, k_hw={tuple(k_hw)}')
        # one (heads, Hq, Wq) image per key: convolve the query grid, heads as channels
        x = attn.permute(0, 3, 1, 2).reshape(b * nk, h, *q_hw)
        k = self.dwconv.kernel_size[0]
        pad = [(-s) % self.stride + max(k - self.stride, 0) for s in q_hw]
        if pad[0] or pad[1]:
            x = F.pad(x, (0, pad[1], 0, pad[0]))
        x = self.pwconv(self.dwconv(x))
        oq = x.shape[-2:]
        if self.gamma is not None:
            x = x * self.gamma.view(1, -1, 1, 1)
        x = x.reshape(b, nk, self.out_heads, oq[0] * oq[1]).permute(0, 2, 3, 1)
        if self.key_stride > 1:
            s = self.key_stride
            grid = x.reshape(b * self.out_heads, oq[0] * oq[1], *k_hw)
            grid = F.avg_pool2d(grid, s, s, ceil_mode=True)
            k_hw = tuple(grid.shape[-2:])
            x = grid.reshape(b, self.out_heads, oq[0] * oq[1], k_hw[0] * k_hw[1])
        if out_k_hw is not None:
            x = fit_key_grid(x, k_hw, out_k_hw)
        return x
