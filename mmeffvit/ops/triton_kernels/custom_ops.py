"""The Triton kernels registered as ``torch.library`` custom ops (namespace ``mmeffvit``).

``mmeffvit::focused_linear_attention`` returns the output and the packed fp32 state that its
backward op ``mmeffvit::focused_linear_attention_backward`` reads; the autograd formula calls the
backward op, which recomputes the focused features instead of keeping them.
``mmeffvit::window_attention`` returns the output and the rows' log-sum-exp, from which
``mmeffvit::window_attention_backward`` recomputes the probabilities.
``mmeffvit::query_grid_conv`` (+ ``_backward``): LaViT's attention-residual conv.
``mmeffvit::linear_attention`` (+ ``_backward``): kv-first attention on mapped features.
``mmeffvit::stripe_attention`` (+ ``_backward``): a branch of CSWin's stripe attention with LePE.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .focused_linear_attention import interpreting  # noqa: F401 (runs_on reads it here)
from . import linear_attention as kv_first
from . import query_grid_conv as grid_conv
from . import stripe_attention as stripes
from . import window_attention as window
from .focused_linear_attention import (launch_backward, launch_forward, padded, state_layout,
                                       token_splits)


@torch.library.custom_op('mmeffvit::focused_linear_attention', mutates_args=())
def focused_linear_attention(q: Tensor, k: Tensor, v: Tensor, scale: Tensor, heads: int,
                             focusing_factor: float, focus_eps: float, eps: float,
                             residual: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """FLatten's focused linear attention, two Triton passes (see
    :mod:`.focused_linear_attention`); q, k, v of one floating dtype (fp32, bf16, fp16)."""
    return launch_forward(q, k, v, scale, heads, focusing_factor, focus_eps, eps, residual)


@focused_linear_attention.register_fake
def _(q, k, v, scale, heads, focusing_factor, focus_eps, eps, residual):
    d, e, d_pad, e_pad = state_layout(q.shape[2], v.shape[2], heads)
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
    return out, q.new_empty(q.shape[0] * heads, d_pad * e_pad + d_pad, dtype=torch.float32)


@torch.library.custom_op('mmeffvit::focused_linear_attention_backward', mutates_args=())
def focused_linear_attention_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor,
                                      scale: Tensor, state: Tensor, heads: int,
                                      focusing_factor: float, focus_eps: float,
                                      eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of q, k, v (their dtypes) and of the scale (fp32, C entries)."""
    return launch_backward(grad, q, k, v, scale, state, heads, focusing_factor, focus_eps, eps)


@focused_linear_attention_backward.register_fake
def _(grad, q, k, v, scale, state, heads, focusing_factor, focus_eps, eps):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty(q.shape[2], dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    q, k, v, scale, heads, focusing_factor, focus_eps, eps, residual = inputs
    ctx.save_for_backward(q, k, v, scale, output[1])
    ctx.params = (heads, focusing_factor, focus_eps, eps)
    ctx.residual_dtype = None if residual is None else residual.dtype


def _backward(ctx, grad, grad_state):
    q, k, v, scale, state = ctx.saved_tensors
    dq, dk, dv, dscale = torch.ops.mmeffvit.focused_linear_attention_backward(
        grad, q, k, v, scale, state, *ctx.params)
    d_residual = None if ctx.residual_dtype is None else grad.to(ctx.residual_dtype)
    return (dq, dk, dv, dscale.reshape(scale.shape).to(scale.dtype), None, None, None, None,
            d_residual)


focused_linear_attention.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op('mmeffvit::window_attention', mutates_args=())
def window_attention(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
                     mask: Optional[Tensor], scale: float) -> Tuple[Tensor, Tensor]:
    """Softmax attention in windows (see :mod:`.window_attention`): q, k, v ``(BW, h, n, ·)``
    of one floating dtype, ``n ≤ 256``; bias and mask ``(BW | 1, h | 1, n, n)``. Returns the
    output heads apart ``(BW, n, h, e)`` and the fp32 log-sum-exp ``(BW, h, n)``."""
    return window.launch_forward(q, k, v, bias, mask, scale)


@window_attention.register_fake
def _(q, k, v, bias, mask, scale):
    bw, h, n, _ = q.shape
    return (q.new_empty(bw, n, h, v.shape[-1]),
            q.new_empty(bw, h, n, dtype=torch.float32))


@torch.library.custom_op('mmeffvit::window_attention_backward', mutates_args=())
def window_attention_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor,
                              bias: Optional[Tensor], mask: Optional[Tensor], out: Tensor,
                              lse: Tensor, scale: float,
                              bias_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv and the bias gradient (empty unless ``bias_grad``)."""
    return window.launch_backward(grad, q, k, v, bias, mask, out, lse, scale, bias_grad)


@window_attention_backward.register_fake
def _(grad, q, k, v, bias, mask, out, lse, scale, bias_grad):
    dbias = bias.new_empty(bias.shape) if bias_grad else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


def _window_setup_context(ctx, inputs, output):
    q, k, v, bias, mask, scale = inputs
    ctx.save_for_backward(q, k, v, bias, mask, *output)
    ctx.scale = scale


def _window_backward(ctx, grad, grad_lse):
    q, k, v, bias, mask, out, lse = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = torch.ops.mmeffvit.window_attention_backward(
        grad, q, k, v, bias, mask, out, lse, ctx.scale, bias_grad)
    return dq, dk, dv, dbias if bias_grad else None, None, None


window_attention.register_autograd(_window_backward, setup_context=_window_setup_context)


@torch.library.custom_op('mmeffvit::query_grid_conv', mutates_args=())
def query_grid_conv(attn: Tensor, weight: Tensor, bias: Optional[Tensor], stride: int,
                    out_h: int, out_w: int) -> Tensor:
    """LaViT's conv over the query grid of ``(B, h, Hq, Wq, Nk)`` scores (see
    :mod:`.query_grid_conv`); ``(B, O, out_h, out_w, Nk)`` in the dtype of ``attn``."""
    return grid_conv.launch_forward(attn, weight, bias, stride, (out_h, out_w))


@query_grid_conv.register_fake
def _(attn, weight, bias, stride, out_h, out_w):
    return attn.new_empty(attn.shape[0], weight.shape[0], out_h, out_w, attn.shape[-1])


@torch.library.custom_op('mmeffvit::query_grid_conv_backward', mutates_args=())
def query_grid_conv_backward(grad: Tensor, attn: Tensor, weight: Tensor, stride: int, out_h: int,
                             out_w: int, need_attn: bool, need_weight: bool,
                             need_bias: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of the scores, the weight and the bias (empty where not needed)."""
    return grid_conv.launch_backward(grad, attn, weight, stride, (out_h, out_w), need_attn,
                                     need_weight, need_bias)


@query_grid_conv_backward.register_fake
def _(grad, attn, weight, stride, out_h, out_w, need_attn, need_weight, need_bias):
    return (attn.new_empty(attn.shape) if need_attn else attn.new_empty(0),
            weight.new_empty(weight.shape) if need_weight else attn.new_empty(0),
            weight.new_empty(weight.shape[0]) if need_bias else attn.new_empty(0))


def _grid_setup_context(ctx, inputs, output):
    attn, weight, bias, stride, out_h, out_w = inputs
    ctx.save_for_backward(attn, weight)
    ctx.geometry = (stride, out_h, out_w)
    ctx.has_bias = bias is not None


def _grid_backward(ctx, grad):
    attn, weight = ctx.saved_tensors
    need_attn, need_weight, need_bias = ctx.needs_input_grad[:3]
    grad_attn, grad_weight, grad_bias = torch.ops.mmeffvit.query_grid_conv_backward(
        grad, attn, weight, *ctx.geometry, need_attn, need_weight,
        ctx.has_bias and need_bias)
    return (grad_attn if need_attn else None, grad_weight if need_weight else None,
            grad_bias if ctx.has_bias and need_bias else None, None, None, None)


query_grid_conv.register_autograd(_grid_backward, setup_context=_grid_setup_context)


@torch.library.custom_op('mmeffvit::linear_attention', mutates_args=())
def linear_attention(q: Tensor, k: Tensor, v: Tensor, temperature: Optional[Tensor], mode: int,
                     eps: float, clamp_min: float) -> Tuple[Tensor, Tensor]:
    """Kv-first linear attention on mapped ``(B, h, tokens, ·)`` features (see
    :mod:`.linear_attention`; ``mode`` 0: mean form, 1: clamped sum), ``temperature`` ``(h,)``.
    Returns ``(B, h, N, e)`` and the packed fp32 state."""
    return kv_first.launch_forward(q, k, v, temperature, mode, eps, clamp_min)


@linear_attention.register_fake
def _(q, k, v, temperature, mode, eps, clamp_min):
    d, e = padded(q.shape[-1]), padded(v.shape[-1])
    return (q.new_empty(*q.shape[:3], v.shape[-1]),
            q.new_empty(q.shape[0] * q.shape[1], d * e + d, dtype=torch.float32))


@torch.library.custom_op('mmeffvit::linear_attention_backward', mutates_args=())
def linear_attention_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor,
                              temperature: Optional[Tensor], state: Tensor, mode: int,
                              eps: float, clamp_min: float) -> Tuple[Tensor, Tensor, Tensor,
                                                                     Tensor]:
    """dq, dk, dv and the temperature's gradient (``(h,)`` fp32, empty without one)."""
    return kv_first.launch_backward(grad, q, k, v, temperature, state, mode, eps, clamp_min)


@linear_attention_backward.register_fake
def _(grad, q, k, v, temperature, state, mode, eps, clamp_min):
    heads = 0 if temperature is None else q.shape[1]
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty(heads, dtype=torch.float32))


def _kv_first_setup_context(ctx, inputs, output):
    q, k, v, temperature, mode, eps, clamp_min = inputs
    ctx.save_for_backward(q, k, v, temperature, output[1])
    ctx.params = (mode, eps, clamp_min)


def _kv_first_backward(ctx, grad, grad_state):
    q, k, v, temperature, state = ctx.saved_tensors
    dq, dk, dv, d_temp = torch.ops.mmeffvit.linear_attention_backward(
        grad, q, k, v, temperature, state, *ctx.params)
    d_temp = None if temperature is None else d_temp.to(temperature.dtype)
    return dq, dk, dv, d_temp, None, None, None


linear_attention.register_autograd(_kv_first_backward, setup_context=_kv_first_setup_context)


@torch.library.custom_op('mmeffvit::stripe_attention', mutates_args=())
def stripe_attention(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Optional[Tensor],
                     height: int, width: int, window_h: int, window_w: int, heads: int,
                     scale: float) -> Tuple[Tensor, Tensor]:
    """Softmax attention in ``window_h × window_w`` windows of the map plus LePE (see
    :mod:`.stripe_attention`): q, k, v ``(B, H·W, C)`` of one floating dtype, LePE's weight
    ``(C, 1, 3, 3)`` and bias ``(C,)``. Returns ``(B, H·W, C)`` and the fp32 log-sum-exp."""
    return stripes.launch_forward(q, k, v, weight, bias, (height, width), (window_h, window_w),
                                  heads, scale)


@stripe_attention.register_fake
def _(q, k, v, weight, bias, height, width, window_h, window_w, heads, scale):
    _, windows, n = stripes.geometry((height, width), (window_h, window_w))
    lse = q.new_empty(q.shape[0] * windows * heads, n, dtype=torch.float32)
    return q.new_empty(q.shape), lse


@torch.library.custom_op('mmeffvit::stripe_attention_backward', mutates_args=())
def stripe_attention_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, weight: Tensor,
                              lse: Tensor, height: int, width: int, window_h: int, window_w: int,
                              heads: int, scale: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv and LePE's gradients ``(C, 10)`` fp32 (nine taps, then the bias)."""
    return stripes.launch_backward(grad, q, k, v, weight, lse, (height, width),
                                   (window_h, window_w), heads, scale)


@stripe_attention_backward.register_fake
def _(grad, q, k, v, weight, lse, height, width, window_h, window_w, heads, scale):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty(q.shape[2], 10, dtype=torch.float32))


def _stripe_setup_context(ctx, inputs, output):
    q, k, v, weight, bias, *geometry = inputs
    ctx.save_for_backward(q, k, v, weight, output[1])
    ctx.geometry = geometry
    ctx.has_bias = bias is not None


def _stripe_backward(ctx, grad, grad_lse):
    q, k, v, weight, lse = ctx.saved_tensors
    dq, dk, dv, lepe = torch.ops.mmeffvit.stripe_attention_backward(
        grad, q, k, v, weight, lse, *ctx.geometry)
    dweight = lepe[:, :9].reshape(weight.shape).to(weight.dtype)
    dbias = lepe[:, 9].to(weight.dtype) if ctx.has_bias else None
    return (dq, dk, dv, dweight, dbias) + (None, ) * 6


stripe_attention.register_autograd(_stripe_backward, setup_context=_stripe_setup_context)


def _forward_cost(q, k, v, scale, heads, *_):
    """Kernel launches and FLOPs of the forward: pass 1, the sum of the partial states where
    there are several, pass 2; two products of ``D×E`` per token and head."""
    launches = 2 + (token_splits(k.shape[1])[0] > 1)
    return launches, 2 * heads * (k.shape[1] + q.shape[1]) * (q.shape[2] // heads) * (
        v.shape[2] // heads) * q.shape[0]


def _backward_cost(grad, q, k, v, scale, state, heads, *_):
    """The query pass (and its partial sums), the key pass, a focus pass for q and one for k,
    the scale gradient's sum; four products of ``D×E`` per token and head."""
    launches = 5 + (token_splits(q.shape[1])[0] > 1)
    return launches, 4 * heads * (k.shape[1] + q.shape[1]) * (q.shape[2] // heads) * (
        v.shape[2] // heads) * q.shape[0]


def _window_forward_cost(q, k, v, *_):
    """One launch; the scores and the weighted sum."""
    bw, h, n, d = q.shape
    return 1, 2 * bw * h * n * n * (d + v.shape[-1])


def _window_backward_cost(grad, q, k, v, bias, mask, out, lse, scale, bias_grad):
    """One launch, plus the sum of the score gradients over broadcast windows or heads and
    its cast where the bias is trained; the scores again and four products."""
    bw, h, n, d = q.shape
    launches = 1
    if bias_grad:
        launches += (bias.shape[0] == 1 or bias.shape[1] == 1) + (bias.dtype != torch.float32)
    return launches, 2 * bw * h * n * n * (3 * d + 2 * v.shape[-1])


def _grid_forward_cost(attn, weight, bias, stride, out_h, out_w):
    """One launch; a multiply-add per output, input head and tap."""
    b, h, _, _, nk = attn.shape
    return 1, 2 * b * weight.shape[0] * out_h * out_w * nk * h * weight.shape[-1] ** 2


def _grid_backward_cost(grad, attn, weight, stride, out_h, out_w, need_attn, need_weight,
                        need_bias):
    """The scores' gradient; the weight's partial sums and their sum; the bias' sum; each sum
    cast to a weight that is not fp32."""
    _, flops = _grid_forward_cost(attn, weight, None, stride, out_h, out_w)
    per_sum = 1 + (weight.dtype != torch.float32)
    return need_attn + need_weight * (1 + per_sum) + need_bias * per_sum, flops * (
        need_attn + need_weight)


def _kv_first_forward_cost(q, k, v, temperature, *_):
    """Pass 1, the partial states' sum where there are several, pass 2."""
    b, h, n_q, d = q.shape
    return 2 + (token_splits(k.shape[2])[0] > 1), 2 * b * h * (k.shape[2] + n_q) * d * v.shape[-1]


def _kv_first_backward_cost(grad, q, k, v, temperature, *_):
    """The query pass (and its partial sums), the key pass, the temperature's sum."""
    b, h, n_q, d = q.shape
    launches = 2 + (token_splits(n_q)[0] > 1) + (temperature is not None)
    return launches, 4 * b * h * (k.shape[2] + n_q) * d * v.shape[-1]


def _stripe_forward_cost(q, k, v, weight, bias, height, width, window_h, window_w, heads,
                         scale):
    """One launch; the scores and the weighted sum over each whole window, LePE's taps."""
    _, windows, n = stripes.geometry((height, width), (window_h, window_w))
    b, tokens, c = q.shape
    return 1, 4 * b * windows * n * n * c + 18 * b * tokens * c


def _stripe_backward_cost(grad, q, k, v, weight, lse, height, width, window_h, window_w, heads,
                          scale):
    """The query kernel (the output again, dq, LePE's partial sums), the key kernel (dk, dv),
    the partial sums' reduction; nine products of the window's scores with the heads."""
    _, windows, n = stripes.geometry((height, width), (window_h, window_w))
    b, tokens, c = q.shape
    return 3, 18 * b * windows * n * n * c + 36 * b * tokens * c


#: ``name -> f(*args) -> (kernel launches, FLOPs)`` of each op, for the kernel counter
COSTS = {'mmeffvit.focused_linear_attention': _forward_cost,
         'mmeffvit.focused_linear_attention_backward': _backward_cost,
         'mmeffvit.window_attention': _window_forward_cost,
         'mmeffvit.window_attention_backward': _window_backward_cost,
         'mmeffvit.query_grid_conv': _grid_forward_cost,
         'mmeffvit.query_grid_conv_backward': _grid_backward_cost,
         'mmeffvit.linear_attention': _kv_first_forward_cost,
         'mmeffvit.linear_attention_backward': _kv_first_backward_cost,
         'mmeffvit.stripe_attention': _stripe_forward_cost,
         'mmeffvit.stripe_attention_backward': _stripe_backward_cost}
