"""Small tensor helpers shared by the models."""
import functools

import torch
import torch.nn.functional as F


def at_least_fp32(t):
    """``t`` in float32, or kept in float64 (reduced-precision inputs are upcast)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@functools.lru_cache(maxsize=64)
def _resize_matrix(src, dst, mode, dtype, device):
    """``(dst, src)`` matrix of the 1-D ``mode`` resize of ``F.interpolate`` (align_corners False).

    Read off ``F.interpolate`` itself: ``src`` one-hot rows resized along H to ``dst`` (a width of
    one is left unchanged by both modes), so the weights, the border clamping and the scale
    ``src / dst`` are torch's own.
    """
    with torch.inference_mode(False), torch.no_grad():  # cached: usable by autograd later
        eye = torch.eye(src, dtype=dtype, device=device).reshape(1, src, src, 1)
        weights = F.interpolate(eye, size=(dst, 1), mode=mode, align_corners=False)
    return weights.reshape(src, dst).t().contiguous()


def resize_token_grid(tokens, src_hw, dst_hw, mode='bicubic'):
    """Resize row-major grid tokens ``(B, Hs*Ws, C)`` to ``(B, Hd*Wd, C)`` (identity if equal).

    ``'bilinear'`` and ``'bicubic'`` (align_corners False, as ``F.interpolate``) are separable:
    they run as two small matrix products on the ``(B, Hs, Ws, C)`` token layout, which gives
    ``F.interpolate``'s result up to float rounding without its permutes, and on a CPU an order
    of magnitude faster than its bicubic kernel (forward and backward). Other modes go through
    ``F.interpolate``.
    """
    src_hw, dst_hw = tuple(src_hw), tuple(dst_hw)
    if src_hw == dst_hw:
        return tokens
    b, c = tokens.shape[0], tokens.shape[-1]
    grid = at_least_fp32(tokens.reshape(b, src_hw[0], src_hw[1], c))
    if (mode not in ('bilinear', 'bicubic') or torch.jit.is_tracing()
            or torch.compiler.is_compiling()):
        # tracing (complexity counts, compiling): the plain operator, not the cached matrices
        kwargs = {} if mode == 'nearest' else dict(align_corners=False)
        out = F.interpolate(grid.permute(0, 3, 1, 2), size=dst_hw, mode=mode, **kwargs)
        return out.permute(0, 2, 3, 1).reshape(b, -1, c).to(tokens.dtype)
    rows, cols = (_resize_matrix(s, d, mode, grid.dtype, grid.device)
                  for s, d in zip(src_hw, dst_hw))
    grid = torch.matmul(cols, grid)  # (B, Hs, Wd, C): along W, batched over rows
    out = torch.matmul(rows, grid.reshape(b, src_hw[0], -1))  # (B, Hd, Wd·C): along H
    return out.reshape(b, -1, c).to(tokens.dtype)


class TokenGridResizeCache:
    """The last :func:`resize_token_grid` of a parameter, reused while no gradient can flow.

    In evaluation (grad disabled or the parameter frozen) the resized tensor depends only on the
    parameter's values and the grid, so it is kept for the next call with the same
    ``(grids, mode, dtype, device, param._version, storage)``; in-place updates (optimiser
    steps, ``load_state_dict``) bump ``_version`` and invalidate it. One entry: memory stays at
    one resized copy per parameter. In training the resize runs every call (autograd needs it).
    """

    def __init__(self):
        self.key = None
        self.value = None

    def __call__(self, param, src_hw, dst_hw, mode='bicubic'):
        if torch.is_grad_enabled() and param.requires_grad or torch.compiler.is_compiling():
            return resize_token_grid(param, src_hw, dst_hw, mode)
        key = (tuple(src_hw), tuple(dst_hw), mode, param.dtype, param.device, param._version,
               param.data_ptr(), torch.is_inference_mode_enabled())
        if key != self.key:
            self.key, self.value = None, None  # release the old copy first
            with torch.no_grad():
                self.value = resize_token_grid(param, src_hw, dst_hw, mode)
            self.key = key
        return self.value

    def __getstate__(self):  # never pickle or deep-copy a cached tensor
        return {'key': None, 'value': None}

    def __setstate__(self, state):
        self.__dict__.update(state)


def tokens_to_map(tokens, hw_shape):
    """Row-major tokens ``(B, H*W, C)`` → channels-first map ``(B, C, H, W)`` (a view)."""
    b, _, c = tokens.shape
    return tokens.transpose(1, 2).reshape(b, c, *hw_shape)


# Tokens per block of tokens_to_contiguous_map: 128K values (512 KiB fp32, in L2 with its copy)
_TRANSPOSE_BLOCK_ELEMENTS = 1 << 17


def tokens_to_contiguous_map(tokens, hw_shape):
    """``tokens_to_map(tokens, hw_shape).contiguous()``: a backbone's output map.

    In CPU inference the transpose is copied one block of tokens at a time, whose source and
    destination stay in cache (torch copies the whole permuted view in one pass; measured
    faster at stage-1 sizes, ``docs/ops.md``). Elsewhere (autograd, other devices) the plain
    copy. Same values.
    """
    view = tokens_to_map(tokens, hw_shape)
    if (tokens.device.type != 'cpu' or (torch.is_grad_enabled() and tokens.requires_grad)
            or view.is_contiguous()):
        return view.contiguous()
    b, n, c = tokens.shape
    out = tokens.new_empty(b, c, *hw_shape)
    flat = out.view(b, c, n)
    step = max(64, _TRANSPOSE_BLOCK_ELEMENTS // c)
    for i in range(b):
        for start in range(0, n, step):
            flat[i, :, start:start + step].copy_(tokens[i, start:start + step].t())
    return out


def map_to_tokens(feature_map):
    """Channels-first map ``(B, C, H, W)`` → row-major tokens ``(B, H*W, C)`` and ``(H, W)``."""
    hw = (int(feature_map.shape[-2]), int(feature_map.shape[-1]))
    return feature_map.flatten(2).transpose(1, 2), hw


def split_heads(projected, parts, num_heads):
    """``(B, N, parts·C)`` fused projections (e.g. ``qkv``) → ``parts`` views ``(B, h, N, C/h)``.

    The same views as ``reshape(B, N, parts, h, d).permute(2, 0, 3, 1, 4)``, taken as
    ``unbind(2)`` then a transpose, so that the backward stacks the parts' gradients straight
    into the ``(B, N, parts·C)`` layout; through the permute it stacked them head-major and then
    copied them once more into that layout (a measurable share of an L²ViT-T training step).
    """
    b, n, _ = projected.shape
    parts_view = projected.reshape(b, n, parts, num_heads, -1)
    return tuple(part.transpose(1, 2) for part in parts_view.unbind(2))


def square_side(num_tokens, what='tokens'):
    """Side of a square token grid, with a clear error when ``num_tokens`` is not a square."""
    side = int(round(num_tokens ** 0.5))
    if side * side != num_tokens:
        raise ValueError(f'{what}: {num_tokens} tokens do not form a square grid')
    return side
