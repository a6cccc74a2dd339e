"""Patch embedding of the pyramid backbones: a strided conv from a map to tokens, and a norm."""
import torch.nn as nn

from ...utils import map_to_tokens, tokens_to_map
from .norm import LayerNormFP32
from .window import pad_to_multiple

_NORM_PLACES = ('after', 'before', None)


class PatchEmbed(nn.Module):
    """``Conv(k, s, p)`` on a map, returning row-major tokens and their grid ``(H', W')``.

    One class for the stems and downsampling layers of PVT v1 / LaViT / Swin (non-overlapping,
    ``k = s``), PVT v2 (overlapping, ``p = k // 2``), the Focal Transformer (either) and L²ViT
    (LayerNorm *before* a ``2×2`` conv, or its conv stem passed as ``proj``). The parameters are
    named ``proj`` and ``norm`` as in all these official codes, so their checkpoints load.
    mmcv's ``PatchEmbed`` calls its conv ``projection`` and timm's neither overlaps nor returns
    the grid, hence this class.

    Any input size: with ``pad_input`` the map is zero-padded at the bottom/right to a multiple
    of ``stride`` first, so ``H×W`` becomes ``⌈H/s⌉×⌈W/s⌉`` (aligned with FPN strides; the
    official non-overlapping embeddings drop the remainder instead). A ``p = k // 2`` conv with
    ``k > s`` already gives ``⌈H/s⌉`` and needs no padding.

    Args:
        in_channels (int): Input channels.
        embed_dims (int): Output channels.
        kernel_size (int): Conv kernel.
        stride (int, optional): Conv stride; default ``kernel_size`` (non-overlapping patches).
        padding (int): Conv padding.
        pad_input (bool): Zero-pad the input to a multiple of ``stride`` first (see above).
        norm (str | None): ``'after'``: LayerNorm on the output tokens; ``'before'``: LayerNorm
            on the input tokens (L²ViT's downsampling; the input must then be tokens);
            None: no norm.
        proj (nn.Module, optional): Replaces the conv (L²ViT's two-conv stem); it must map
            ``in_channels`` to ``embed_dims`` with the total stride ``stride``.

    Example:
        >>> import torch
        >>> embed = PatchEmbed(3, 64, kernel_size=7, stride=4, padding=3, pad_input=False)
        >>> tokens, hw = embed(torch.rand(1, 3, 333, 517))
        >>> tuple(tokens.shape), hw
        ((1, 10920, 64), (84, 130))
        >>> merge = PatchEmbed(64, 128, kernel_size=2, norm='before')
        >>> tokens, hw = merge(tokens, hw)
        >>> tuple(tokens.shape), hw
        ((1, 2730, 128), (42, 65))
    """

    def __init__(self, in_channels, embed_dims, kernel_size, stride=None, padding=0,
                 pad_input=True, norm='after', proj=None):
        super().__init__()
        if norm not in _NORM_PLACES:
            raise ValueError(f"norm must be one of {_NORM_PLACES}, got {norm!r}")
        self.stride = kernel_size if stride is None else stride
        self.pad_input = pad_input
        self.norm_first = norm == 'before'
        self.proj = proj if proj is not None else nn.Conv2d(
            in_channels, embed_dims, kernel_size, stride=self.stride, padding=padding)
        if norm is None:
            self.norm = nn.Identity()
        else:
            self.norm = LayerNormFP32(in_channels if self.norm_first else embed_dims)

    def forward(self, x, hw_shape=None):
        """Args:
            x (Tensor): A map ``(B, C, H, W)``, or tokens ``(B, H*W, C)`` on ``hw_shape``.

        Returns:
            tuple: tokens ``(B, H'*W', embed_dims)`` and the grid ``(H', W')``.
        """
        if x.dim() == 3:
            x = tokens_to_map(self.norm(x) if self.norm_first else x, hw_shape)
        elif self.norm_first:
            raise ValueError("norm='before' normalises tokens: pass (B, N, C) and hw_shape")
        if self.pad_input:
            x = pad_to_multiple(x, self.stride)
        x, hw = map_to_tokens(self.proj(x))
        # the conv returns NCHW, whose token view has strides (·, 1, N): a norm after it makes
        # the tokens contiguous; without one, copy once here rather than leave the whole stage's
        # residual stream in that layout (every later norm and conv would copy it again)
        return (x.contiguous() if self.norm_first else self.norm(x)), hw
