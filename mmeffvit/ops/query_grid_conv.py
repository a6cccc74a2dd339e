"""The strided conv over the query grid of a score map: LaViT's attention-residual
downsampling (Zhang et al., CVPR 2024, sec. 3.3, Eq. 6), its depthwise and pointwise convs
folded into one ``(out, in, k, k)`` kernel."""
import torch
import torch.nn.functional as F

from .policy import compiling
from .triton_kernels import selected as triton_selected


def _taps(in_len, out_len, kernel, stride):
    """Per kernel offset ``i``: how many outputs ``y < out_len`` read an input ``s·y + i`` that
    exists (the others read the implicit zero padding)."""
    return [max(0, min(out_len, -(-(in_len - i) // stride))) for i in range(kernel)]


def tail_padding(in_hw, out_hw, kernel, stride):
    """Rows and columns of zeros a stride-``stride`` ``kernel``² conv of an ``in_hw`` map needs
    at the bottom/right to give ``out_hw`` outputs."""
    return [max((n - 1) * stride + kernel - m, 0) for m, n in zip(in_hw, out_hw)]


def query_grid_conv_reference(attn, weight, stride, out_hw, bias=None):
    """What :func:`query_grid_conv` computes, in plain differentiable operators (zero-padded
    copy of the map, one ``einsum`` per kernel tap): the tests' check."""
    k = weight.shape[-1]
    pad_h, pad_w = tail_padding(attn.shape[2:4], out_hw, k, stride)
    attn = F.pad(attn, (0, 0, 0, pad_w, 0, pad_h))
    out = 0
    for i in range(k):
        for j in range(k):
            taps = attn[:, :, i:i + (out_hw[0] - 1) * stride + 1:stride,
                        j:j + (out_hw[1] - 1) * stride + 1:stride]
            out = out + torch.einsum('oh,bhyxn->boyxn', weight[:, :, i, j], taps)
    return out if bias is None else out + bias.view(1, -1, 1, 1, 1)


class _QueryGridConv(torch.autograd.Function):
    """``out[b, o, y, x, n] = Σ_{h,i,j} w[o, h, i, j] · a[b, h, s·y+i, s·x+j, n]`` with zeros
    beyond the input grid: a strided conv over the query grid of a score map, written as sums of
    strided slices in the scores' own layout.

    Why by hand: ``nn.Conv2d`` needs the keys as batch (a full permuted copy of the map) and
    oneDNN pads the 1-5 head channels to its channel block (≈ 8× the map, measured in
    docs/logs/profiles.md); the slices here are views, and backward writes each input element once
    (``k == s``) without saving anything but the input.
    """

    @staticmethod
    def forward(ctx, attn, weight, bias, stride, out_hw):
        b, h, hq, wq, nk = attn.shape
        o, k = weight.shape[0], weight.shape[-1]
        rows, cols = _taps(hq, out_hw[0], k, stride), _taps(wq, out_hw[1], k, stride)
        # the bias is the sums' start: no second full-size map for ``out + bias``
        out = attn.new_empty(b, o, out_hw[0], out_hw[1], nk)
        if bias is None:
            out.zero_()
        else:
            out.copy_(bias.view(1, o, 1, 1, 1).expand_as(out))
        for i in range(k):
            for j in range(k):
                if not rows[i] or not cols[j]:
                    continue
                src = attn[:, :, i::stride, j::stride][:, :, :rows[i], :cols[j]]
                dst = out[:, :, :rows[i], :cols[j]]
                for c in range(h):
                    dst.addcmul_(src[:, c:c + 1], weight[:, c, i, j].view(1, o, 1, 1, 1))
        ctx.save_for_backward(attn, weight)
        ctx.geometry = (stride, rows, cols)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        attn, weight = ctx.saved_tensors
        stride, rows, cols = ctx.geometry
        b, h = attn.shape[:2]
        o, k = weight.shape[0], weight.shape[-1]
        grad_out = grad_out.contiguous()
        need_attn, need_weight = ctx.needs_input_grad[:2]
        covered = k == stride and sum(rows) == attn.shape[2] and sum(cols) == attn.shape[3]
        grad_attn = grad_weight = grad_bias = None
        if ctx.needs_input_grad[2]:
            grad_bias = grad_out.sum((0, 2, 3, 4))
        if need_attn:  # every input read exactly once when k == s: no zero fill needed
            grad_attn = torch.empty_like(attn) if covered else torch.zeros_like(attn)
        if need_weight:
            grad_weight = torch.zeros_like(weight)
        for i in range(k):
            for j in range(k):
                if not rows[i] or not cols[j]:
                    continue
                g = grad_out[:, :, :rows[i], :cols[j]]
                src = attn[:, :, i::stride, j::stride][:, :, :rows[i], :cols[j]]
                if need_attn:
                    part = torch.matmul(weight[:, :, i, j].t(), g.reshape(b, o, -1))
                    part = part.view(b, h, *g.shape[2:])
                    dst = grad_attn[:, :, i::stride, j::stride][:, :, :rows[i], :cols[j]]
                    dst.copy_(part) if covered else dst.add_(part)
                if need_weight:
                    grad_weight[:, :, i, j] = torch.matmul(
                        g.reshape(b, o, -1), src.reshape(b, h, -1).transpose(1, 2)).sum(0)
        return grad_attn, grad_weight, grad_bias, None, None


def query_grid_conv(attn, weight, bias, stride, out_hw):
    """``out[b, o, y, x, n] = Σ_{h,i,j} w[o, h, i, j] · a[b, h, s·y+i, s·x+j, n] + bias[o]``
    with zeros beyond the input grid.

    Args:
        attn (Tensor): ``(B, in, Hq, Wq, Nk)`` scores on their query grid.
        weight (Tensor): ``(out, in, k, k)``.
        bias (Tensor | None): ``(out, )``.
        stride (int): ``s``.
        out_hw (tuple[int, int]): Output query grid.

    Returns:
        Tensor: ``(B, out, Ho, Wo, Nk)``.

    With the Triton kernels selected (``use_kernels(triton=True)``): the op
    ``mmeffvit::query_grid_conv``, one launch that reads every tap in place (``k·k·in``
    multiply-adds over strided slices otherwise).
    """
    if attn.dim() != 5 or weight.dim() != 4 or weight.shape[1] != attn.shape[1] or (
            weight.shape[2] != weight.shape[3]):
        raise ValueError(f'query_grid_conv expects scores (B, in, Hq, Wq, Nk) and a square '
                         f'(out, in, k, k) weight, got {tuple(attn.shape)} and '
                         f'{tuple(weight.shape)}')
    if bias is not None and tuple(bias.shape) != (weight.shape[0], ):
        raise ValueError(f'bias must have shape ({weight.shape[0]}, ), got {tuple(bias.shape)}')
    if triton_selected(attn, weight, *([] if bias is None else [bias])):
        return torch.ops.mmeffvit.query_grid_conv(attn, weight, bias, int(stride),
                                                  int(out_hw[0]), int(out_hw[1]))
    if compiling():  # the compiler plans the memory that _QueryGridConv saves
        return query_grid_conv_reference(attn, weight, stride, tuple(out_hw), bias)
    return _QueryGridConv.apply(attn, weight, bias, stride, tuple(out_hw))
