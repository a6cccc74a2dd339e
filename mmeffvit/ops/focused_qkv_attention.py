"""FLatten's attention on a fused ``qkv`` projection, with its depthwise-conv term (sec. 4,
eq. 5-9): ``FLA(q, k + pe, v) + DWC(v)`` where ``q, k, v`` split ``x Wᵀ + b``.

:func:`focused_qkv_attention` is the entry point. On the CPU in fp32, with the compiled operators
and the fused linear kernel, it chooses a path of its own: in training
:class:`_QKVFocusedAttention` (the gradients of q, k and v written into the spent projection),
in inference :func:`_split_projection_inference` (``v`` projected apart, in place additions).
Elsewhere the operators composed: :func:`mmeffvit.ops.linear`,
:func:`mmeffvit.ops.focused_linear_attention` and :func:`mmeffvit.ops.depthwise_conv`. Figures:
``docs/ops.md`` (focused linear attention).
"""
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .depthwise_conv import channels_last_weight, depthwise_conv, depthwise_conv_grads
from .ext_loader import get_ext
from .focused_linear_attention import EPS, FOCUS_EPS, focused_linear_attention
from .linear import fused_linear, graph_kept, linear, needs_grad, onednn_applies


class _QKVFocusedAttention(torch.autograd.Function):
    """``FLA(q, k + pe, v) + DWC(v)`` on the output of the fused ``qkv`` projection, in training
    on the CPU.

    The same operators as the composed path (the compiled FLA kernels, oneDNN's depthwise conv,
    :func:`mmeffvit.ops.depthwise_conv_weight_grad`), but the backward writes the gradients of
    q, k and v straight into one ``(B, N, 3C)`` tensor, the memory of the spent ``qkv`` output
    itself (its rows are read before their gradients are written). Composed, autograd writes
    dq, dk, dv and the DWC's dv into four fresh maps, adds two and concatenates three into a
    fifth, whose fresh pages made that concatenation one of the costly steps of a training step
    at detection resolution. Where autograd keeps the graph (``retain_graph``) ``qkv`` stays
    intact and the gradient goes to a new tensor.
    """

    @staticmethod
    def forward(ctx, qkv, pe, scale, dwc_weight, dwc_bias, hw_shape, heads, focusing_factor,
                padding):
        ext = get_ext(qkv)
        b, c = qkv.shape[0], qkv.shape[2] // 3
        q, k, v = qkv.split(c, dim=-1)
        keys = k if pe is None else k + pe
        with torch.autocast(qkv.device.type, enabled=False):
            out, kv, ksum = ext.focused_linear_attention_forward(
                q, keys, v, scale, heads, focusing_factor, FOCUS_EPS, EPS)
            v_map = v.transpose(1, 2).reshape(b, c, *hw_shape)
            dwc = F.conv2d(v_map, dwc_weight, dwc_bias, padding=padding, groups=c)
        out.add_(dwc.flatten(2).transpose(1, 2))
        ctx.save_for_backward(qkv, keys, scale, kv, ksum, dwc_weight)
        ctx.params = (hw_shape, heads, focusing_factor, padding, dwc_bias is not None,
                      None if pe is None else pe.shape)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        qkv, keys, scale, kv, ksum, dwc_weight = ctx.saved_tensors
        hw_shape, heads, focusing_factor, padding, has_bias, pe_shape = ctx.params
        need_qkv, need_pe, need_scale, need_weight, need_bias = ctx.needs_input_grad[:5]
        ext = get_ext(qkv)
        b, c = qkv.shape[0], qkv.shape[2] // 3
        q, k, v = qkv.split(c, dim=-1)
        grad = grad.contiguous()
        grad_map = grad.transpose(1, 2).reshape(b, c, *hw_shape)
        v_map = v.transpose(1, 2).reshape(b, c, *hw_shape)
        # the DWC first: its weight gradient reads v, which the attention's gradient overwrites
        grad_v_dwc, grad_weight, grad_bias = depthwise_conv_grads(
            v_map, grad_map, dwc_weight, padding, True, need_weight, has_bias and need_bias)
        grad_qkv = qkv if not graph_kept() else torch.empty_like(qkv)
        dq, dk, dv = grad_qkv.split(c, dim=-1)
        grad_scale = ext.focused_linear_attention_backward_into(
            grad, q, keys, v, scale, kv, ksum, heads, focusing_factor, FOCUS_EPS, EPS, dq, dk, dv)
        dv.add_(grad_v_dwc.flatten(2).transpose(1, 2))
        grad_pe = None
        if pe_shape is not None and need_pe:
            grad_pe = dk if pe_shape[0] == b else dk.sum(0, keepdim=True)
        return (grad_qkv if need_qkv else None, grad_pe,
                grad_scale.reshape(scale.shape) if need_scale else None, grad_weight, grad_bias,
                None, None, None, None)


def _split_projection_inference(x, qkv_weight, qkv_bias, pe, scale, dwc_weight, dwc_bias,
                                hw_shape, heads, focusing_factor, padding):
    """The composed path's kernels on the same values, in inference: ``v`` gets a GEMM of its
    own (rows of the ``qkv`` weight), so the DWC reads it as a dense channels-last map instead
    of a copy of a strided slice, and the positional encoding and the DWC term are added in
    place (measured: ``docs/ops.md``)."""
    c = qkv_weight.shape[0] // 3
    qk = fused_linear(x, qkv_weight[:2 * c], None if qkv_bias is None else qkv_bias[:2 * c])
    v = fused_linear(x, qkv_weight[2 * c:], None if qkv_bias is None else qkv_bias[2 * c:])
    q, k = qk.split(c, dim=-1)
    if pe is not None:
        k.add_(pe)
    out, _, _ = get_ext(x).focused_linear_attention_forward(
        q, k, v, scale, heads, float(focusing_factor), FOCUS_EPS, EPS)
    return out.add_(depthwise_conv(v, dwc_weight, dwc_bias, hw_shape, padding))


def focused_qkv_attention(x, qkv_weight, qkv_bias, scale, dwc_weight, dwc_bias, hw_shape,
                          num_heads, focusing_factor=3, pe=None, padding=None):
    """``FLA(q, k + pe, v) + DWC(v)`` with ``q, k, v`` the thirds of ``x Wᵀ + b``: FLatten's
    focused linear attention (sec. 4.1, eq. 5-7) and its rank-restoring depthwise conv on V
    (sec. 4.2, eq. 9; one kernel set shared by every head), before the output projection.

    Args:
        x (Tensor): ``(B, H*W, C_in)`` tokens.
        qkv_weight (Tensor): ``(3C, C_in)``; qkv_bias (Tensor | None): ``(3C, )``.
        scale (Tensor): ``C`` raw scale values of the focusing function.
        dwc_weight (Tensor): ``(C/h, 1, k, k)``, shared by the heads; dwc_bias: ``(C/h, )``.
        hw_shape (tuple[int, int]): ``(H, W)``.
        num_heads (int): Heads h.
        focusing_factor (float): The power p.
        pe (Tensor, optional): Positional encoding added to the keys, ``(1 | B, H*W, C)``.
        padding (tuple[int, int], optional): Of the DWC, default ``k // 2`` (size-preserving).

    Returns:
        Tensor: ``(B, H*W, C)``.
    """
    if padding is None:
        padding = (dwc_weight.shape[-2] // 2, dwc_weight.shape[-1] // 2)
    padding = tuple(padding)
    weight = dwc_weight.repeat(num_heads, 1, 1, 1)
    bias = None if dwc_bias is None else dwc_bias.repeat(num_heads)
    if onednn_applies(x, qkv_weight) and get_ext(x) is not None:
        if needs_grad(x, qkv_weight, qkv_bias, scale, dwc_weight, dwc_bias, pe):
            qkv = linear(x, qkv_weight, qkv_bias)  # fresh: its memory takes the gradient
            return _QKVFocusedAttention.apply(
                qkv, pe, scale, channels_last_weight(weight), bias, tuple(hw_shape), num_heads,
                float(focusing_factor), padding)
        if qkv_weight.is_contiguous():
            return _split_projection_inference(x, qkv_weight, qkv_bias, pe, scale, weight, bias,
                                               tuple(hw_shape), num_heads, focusing_factor,
                                               padding)
    q, k, v = linear(x, qkv_weight, qkv_bias).chunk(3, dim=-1)
    if pe is not None:
        k = k + pe
    dwc = depthwise_conv(v, weight, bias, hw_shape, padding)
    # the focusing power and the attention sums stay in fp32 under autocast
    with torch.autocast(device_type=x.device.type, enabled=False):
        return focused_linear_attention(q, k, v, scale, num_heads, focusing_factor, residual=dwc)
