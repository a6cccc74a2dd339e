"""Small tensor helpers shared by the models."""
import torch
import torch.nn.functional as F


def at_least_fp32(t):
    """``t`` in float32, or kept in float64 (reduced-precision inputs are upcast)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def resize_token_grid(tokens, src_hw, dst_hw, mode='bicubic'):
    """Resize row-major grid tokens ``(1, Hs*Ws, C)`` to ``(1, Hd*Wd, C)`` (identity if equal)."""
    src_hw, dst_hw = tuple(src_hw), tuple(dst_hw)
    if src_hw == dst_hw:
        return tokens
    c = tokens.shape[-1]
    grid = tokens.reshape(1, src_hw[0], src_hw[1], c).permute(0, 3, 1, 2)
    kwargs = {} if mode == 'nearest' else dict(align_corners=False)
    grid = F.interpolate(at_least_fp32(grid), size=dst_hw, mode=mode, **kwargs).to(tokens.dtype)
    return grid.permute(0, 2, 3, 1).reshape(1, dst_hw[0] * dst_hw[1], c)


def tokens_to_map(tokens, hw_shape):
    """Row-major tokens ``(B, H*W, C)`` → channels-first map ``(B, C, H, W)`` (a view)."""
    b, _, c = tokens.shape
    return tokens.transpose(1, 2).reshape(b, c, *hw_shape)


def map_to_tokens(feature_map):
    """Channels-first map ``(B, C, H, W)`` → row-major tokens ``(B, H*W, C)`` and ``(H, W)``."""
    hw = (int(feature_map.shape[-2]), int(feature_map.shape[-1]))
    return feature_map.flatten(2).transpose(1, 2), hw


def square_side(num_tokens, what='tokens'):
    """Side of a square token grid, with a clear error when ``num_tokens`` is not a square."""
    side = int(round(num_tokens ** 0.5))
    if side * side != num_tokens:
        raise ValueError(f'{what}: {num_tokens} tokens do not form a square grid')
    return side
