"""The CPU linear kernel: ``x @ weightᵀ + bias`` on oneDNN's GEMM with the epilogue fused, or
on ATen's BLAS, as :func:`mmeffvit.ops.policy.policy` chooses (``cpu_gemm``).

Why not ``F.linear`` alone: in eager PyTorch a CPU ``addmm`` first copies the broadcast bias
into its output and then accumulates the product on it, and GELU is one more pass over the
``(N, 4C)`` hidden map; ``mkldnn::_linear_pointwise`` (the kernel torch.compile's CPU backend
emits for these patterns) fuses both (figures: ``docs/ops.md``). Results equal the eager ones to
float rounding (the GEMM's summation order).

:func:`linear` is the entry point: ``F.linear`` where the fused kernel does not apply, the
kernel with the bias fused in inference, and :class:`_OneDNNLinear` under autograd (bias fused
into the forward GEMM, the input gradient through the same kernel). :func:`fused_linear` is the
kernel call itself, for callers that know it applies.

The fused path runs only where it applies: CPU, float32, no autocast, tracing, compiling,
functorch transform or dispatch mode (``FlopCounterMode`` and the complexity tools see the plain
operators).
"""
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..utils.tensor import split_heads as _plain_split_heads
from .norm import layer_norm
from .policy import ONEDNN_LINEAR, compiling, policy


def onednn_gemm() -> bool:
    """Whether the policy in force runs the CPU linears on oneDNN (else ATen's BLAS)."""
    return policy().cpu_gemm == 'onednn'


def onednn_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` may run as oneDNN's fused linear kernel (see the module)."""
    return (ONEDNN_LINEAR and x.device.type == 'cpu' and x.dtype == torch.float32
            and weight.dtype == torch.float32 and not torch.is_autocast_enabled('cpu')
            and not torch.jit.is_tracing() and not compiling()
            and _get_current_dispatch_mode() is None
            and not torch._C._are_functorch_transforms_active())


def needs_grad(*tensors) -> bool:
    """Whether autograd records through any of ``tensors`` (None entries skipped)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def onednn_inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused kernel applies and nothing needs a gradient."""
    return onednn_applies(x, weight) and not needs_grad(x, weight)


def fused_linear(x, weight, bias, activation='none'):
    """``activation(x @ weightᵀ + bias)`` (``'none'`` or ``'gelu'``, exact erf) through
    the policy's GEMM: one oneDNN call, or ``F.linear`` and GELU in place."""
    if onednn_gemm():
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, activation, [],
                                                  'none' if activation == 'gelu' else '')
    out = F.linear(x, weight, bias)
    return torch.ops.aten.gelu_(out) if activation == 'gelu' else out


class _OneDNNLinear(torch.autograd.Function):
    """``x @ weightᵀ + bias`` with the bias fused into oneDNN's forward GEMM; the backward is
    the one of ``addmm`` (``dx = dy·W``, ``dW = dyᵀ·x``, ``db = Σ dy``; ``dx`` through oneDNN
    where it is the policy's GEMM, :func:`_input_grad`), with differentiable operators under
    double backward."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return fused_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        return _OneDNNLinear._grads(ctx, grad_out, x, weight, ctx.needs_input_grad[0])

    @staticmethod
    def _grads(ctx, grad_out, x, weight, input_grad):
        grad_x = grad_weight = grad_bias = None
        if input_grad:
            grad_x = _input_grad(grad_out, weight)
        grad_2d = grad_out.reshape(-1, grad_out.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_weight = grad_2d.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_2d.sum(0)
        return grad_x, grad_weight, grad_bias


def _input_grad(grad_out, weight):
    """``dX = dY·W``, through oneDNN's linear kernel with ``Wᵀ`` as its weight where it applies
    (not under double backward, which needs differentiable operators). MKL's GEMM behind
    ``matmul`` is the slower one on these narrow outputs (``docs/ops.md``); equal to float
    rounding (the summation order)."""
    if (onednn_gemm() and not torch.is_grad_enabled()
            and grad_out.is_contiguous() and onednn_applies(grad_out, weight)):
        return fused_linear(grad_out, weight.t().contiguous(), None)
    return grad_out.matmul(weight)


def graph_kept() -> bool:
    """Whether the running backward keeps the graph (``retain_graph``/``create_graph``), so
    that saved tensors must stay intact; True where torch cannot tell."""
    keep_graph = getattr(torch._C._autograd, '_get_current_graph_task_keep_graph', None)
    return True if keep_graph is None else bool(keep_graph())


def linear(x, weight, bias=None):
    """``F.linear`` with oneDNN's fused forward where it applies (CPU fp32, see the module),
    under autograd too."""
    if not onednn_applies(x, weight):
        return F.linear(x, weight, bias)
    if needs_grad(x, weight, bias):
        return _OneDNNLinear.apply(x, weight, bias)
    return fused_linear(x, weight, bias)


# Rows per block of _GeluLinear: a 2 MiB fp32 block of the hidden map (stays in cache between
# GELU and the GEMM that reads it; 256K-2M elements measured alike, stage shapes of Swin-T)
_GELU_BLOCK_ELEMENTS = 1 << 19


class _GeluLinear(torch.autograd.Function):
    """``gelu(h) @ weightᵀ + bias`` (exact GELU; the MLP's activation and ``fc2``) that keeps
    only ``h``: ``gelu(h)`` is made block by block of rows into a small buffer, in the forward
    for the GEMM and again in the backward for the weight gradient, instead of being stored as
    a second ``(N, 4C)`` map (16-22 % of the training activations of CSWin, L²ViT and Swin
    variants). The GELU is recomputed; the blocks save the page faults of a fresh ``(N, 4C)``
    output, so the step takes no longer (measured: ``docs/ops.md``).

    ``owned=True`` (the caller made ``h`` and nothing else holds it, as in :class:`Mlp`): the
    backward writes GELU's input gradient over the saved ``h`` block by block instead of into a
    fresh tensor (on the CPU a fresh tensor this large is faulted in page by page by the kernel
    that writes it first, which made those GEMMs twice as slow). Where autograd keeps the graph
    for another backward (``retain_graph``) or builds one (double backward) ``h`` stays intact
    and plain differentiable operators run.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, owned=False):
        ctx.save_for_backward(hidden, weight)
        ctx.has_bias, ctx.owned = bias is not None, owned
        hidden_2d = hidden.reshape(-1, hidden.shape[-1])
        out = hidden.new_empty(hidden_2d.shape[0], weight.shape[0])
        for rows, act in _gelu_blocks(hidden_2d):
            if bias is None:
                torch.mm(act, weight.t(), out=out[rows])
            else:
                torch.addmm(bias, act, weight.t(), out=out[rows])
        return out.view(*hidden.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # double backward: differentiable operators
            act = F.gelu(hidden)
            grad_act, grad_weight, grad_bias = _OneDNNLinear._grads(ctx, grad_out, act, weight,
                                                                    need_hidden)
            grad_hidden = (torch.ops.aten.gelu_backward(grad_act, hidden)
                           if grad_act is not None else None)
            return grad_hidden, grad_weight, grad_bias, None
        hidden_2d = hidden.reshape(-1, hidden.shape[-1])
        grad_2d = grad_out.reshape(-1, grad_out.shape[-1])
        grad_hidden = grad_weight = grad_bias = None
        if need_hidden:
            overwrite = ctx.owned and hidden.is_contiguous() and not graph_kept()
            grad_hidden = hidden_2d if overwrite else torch.empty_like(hidden_2d)
            grad_act = _block_buffer(hidden_2d)
        if need_weight:
            grad_weight = weight.new_zeros(weight.shape)
        if need_hidden or need_weight:
            for rows, act in _gelu_blocks(hidden_2d, need_weight):
                grad = grad_2d[rows]
                if need_weight:
                    grad_weight.addmm_(grad.t(), act)
                if need_hidden:
                    block = torch.mm(grad, weight, out=grad_act[:len(grad)])
                    # elementwise: the output may be the input it reads (the owned h)
                    torch.ops.aten.gelu_backward.grad_input(block, hidden_2d[rows],
                                                            grad_input=grad_hidden[rows])
        if ctx.has_bias and need_bias:
            grad_bias = grad_2d.sum(0)
        if grad_hidden is not None:
            grad_hidden = grad_hidden.view_as(hidden)
        return grad_hidden, grad_weight, grad_bias, None


def _gelu_block_rows(hidden_2d):
    return max(64, _GELU_BLOCK_ELEMENTS // max(hidden_2d.shape[1], 1))


def _block_buffer(hidden_2d):
    """A reused ``(rows, width)`` buffer for one block of :func:`_gelu_blocks`."""
    return hidden_2d.new_empty(min(_gelu_block_rows(hidden_2d), len(hidden_2d)),
                               hidden_2d.shape[1])


def _gelu_blocks(hidden_2d, compute=True):
    """``(row slice, gelu(h[rows]))`` over blocks of rows, the GELU written into one reused
    buffer (None when ``compute`` is False)."""
    n = hidden_2d.shape[0]
    step = _gelu_block_rows(hidden_2d)
    buffer = _block_buffer(hidden_2d) if compute else None
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        act = None
        if compute:
            act = torch.ops.aten.gelu.out(hidden_2d[rows], out=buffer[:rows.stop - start])
        yield rows, act


def gelu_linear(hidden, weight, bias=None, owned=False):
    """``gelu(hidden) @ weightᵀ + bias`` (exact GELU): one :class:`_GeluLinear` where the fused
    kernel applies and autograd records through it (``hidden`` is stored alone), else GELU and
    :func:`linear`. ``owned``: ``hidden`` is the caller's intermediate that nothing else holds,
    so its memory may take GELU's input gradient."""
    if onednn_applies(hidden, weight) and needs_grad(hidden, weight, bias):
        return _GeluLinear.apply(hidden, weight, bias, owned)
    return linear(F.gelu(hidden), weight, bias)


def mlp(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias):
    """``fc2(gelu(fc1(x)))`` with exact GELU and nothing between the two linears (the caller
    applies no norm or dropout there): in inference on the fused kernel ``fc1`` and GELU are
    one call; under autograd GELU and ``fc2`` are one :class:`_GeluLinear` that stores the
    pre-activation only, over which its backward writes (``fc1``'s output is held by nobody
    else); elsewhere :func:`linear`, GELU and :func:`linear`."""
    if onednn_inference(x, fc1_weight):
        hidden = fused_linear(x, fc1_weight, fc1_bias, 'gelu')
        return linear(hidden, fc2_weight, fc2_bias)
    if onednn_applies(x, fc2_weight) and needs_grad(x, fc1_weight, fc2_weight):
        hidden = linear(x, fc1_weight, fc1_bias)
        return _GeluLinear.apply(hidden, fc2_weight, fc2_bias, True)
    return linear(F.gelu(linear(x, fc1_weight, fc1_bias)), fc2_weight, fc2_bias)


# CPU inference of a pre-norm MLP residual (mlp_residual): a map whose (N, hidden) activation has
# at least _MLP_BLOCKED_MIN_ELEMENTS runs in blocks of rows of _MLP_BLOCK_ELEMENTS hidden values
# (an 8 MiB block stays in the L3 cache between fc1 and fc2, and no fresh (N, hidden) map is
# faulted in); smaller maps run whole, where the shorter GEMMs of blocks cost more than they save
_MLP_BLOCKED_MIN_ELEMENTS = 1 << 23
_MLP_BLOCK_ELEMENTS = 1 << 21


def mlp_residual(x, norm_weight, norm_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias,
                 norm_eps=1e-5, owned=False, norm_fp32=False):
    """``x + fc2(gelu(fc1(layer_norm(x))))`` (exact GELU): the pre-norm MLP half of a
    transformer block in inference, or wherever nothing (dropout, drop path) acts between.

    ``owned`` (the caller made ``x`` and nothing else holds it): in CPU inference on the fused
    kernel and on a large map it runs in place on ``x``, one block of rows at a time:
    LayerNorm, fc1 + GELU, fc2, add. No ``(N, hidden)`` map is allocated, which lowers the
    inference allocation peak of the families whose peak lies in an MLP, and is faster under
    glibc's default malloc (the whole map would be faulted in fresh); equal in time when freed
    memory is retained (``mmeffvit.utils.allocator``). Figures: ``docs/ops.md``. Elsewhere
    :func:`layer_norm` (``norm_fp32``: the norm's fp32 rule under autocast) and :func:`mlp`.
    Equal either way: the same kernels on the same rows."""
    if owned and _mlp_blocks_apply(x, norm_weight, norm_bias, fc1_weight, fc1_bias, fc2_weight,
                                   fc2_bias):
        x_2d = x.view(-1, x.shape[-1])
        step = max(64, _MLP_BLOCK_ELEMENTS // fc1_weight.shape[0])
        for start in range(0, len(x_2d), step):
            rows = x_2d[start:start + step]
            normed = F.layer_norm(rows, rows.shape[-1:], norm_weight, norm_bias, norm_eps)
            rows.add_(fused_linear(fused_linear(normed, fc1_weight, fc1_bias, 'gelu'),
                                   fc2_weight, fc2_bias))
        return x
    normed = layer_norm(x, x.shape[-1:], norm_weight, norm_bias, norm_eps, fp32=norm_fp32)
    return x + mlp(normed, fc1_weight, fc1_bias, fc2_weight, fc2_bias)


def _mlp_blocks_apply(x, norm_weight, norm_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias):
    return (x.is_contiguous() and x.dim() >= 2 and x.shape[-1] == fc1_weight.shape[1]
            and x.numel() // x.shape[-1] * fc1_weight.shape[0] >= _MLP_BLOCKED_MIN_ELEMENTS
            and onednn_applies(x, fc1_weight) and fc2_weight.dtype == torch.float32
            and not needs_grad(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, norm_weight,
                               norm_bias))


class _SplitHeadsOverSpent(torch.autograd.Function):
    """:func:`mmeffvit.utils.split_heads` of a projection's output that nothing else holds,
    whose backward writes the parts' gradients over that output instead of stacking them into
    a fresh ``(B, N, parts·C)`` tensor (autograd's ``unbind`` backward). The parts' consumers
    have run their backward by then, so the projection is spent; a fresh map of that size is
    faulted in page by page on the CPU (``docs/ops.md``). Where autograd keeps the graph
    (``retain_graph``) or builds one (double backward) the gradient goes to a new tensor."""

    @staticmethod
    def forward(ctx, projected, parts, num_heads):
        ctx.save_for_backward(projected)
        ctx.parts, ctx.num_heads = parts, num_heads
        return _plain_split_heads(projected, parts, num_heads)

    @staticmethod
    def backward(ctx, *grads):
        projected, = ctx.saved_tensors
        b, n, _ = projected.shape
        if torch.is_grad_enabled():  # double backward: differentiable, as unbind's backward
            head_dims = projected.shape[-1] // (ctx.parts * ctx.num_heads)
            return torch.stack([
                g.transpose(1, 2) if g is not None
                else projected.new_zeros(b, n, ctx.num_heads, head_dims) for g in grads],
                2).reshape(b, n, -1), None, None
        # spent unless the graph is kept: every consumer of the parts has run its backward
        out = torch.empty_like(projected) if graph_kept() else projected
        out_parts = out.view(b, n, ctx.parts, ctx.num_heads, -1)
        for i, grad in enumerate(grads):
            if grad is None:
                out_parts[:, :, i].zero_()
            else:
                out_parts[:, :, i].copy_(grad.transpose(1, 2))
        return out, None, None


def split_heads(projected, parts, num_heads, owned=False):
    """``mmeffvit.utils.split_heads(projected, parts, num_heads)``: a fused projection
    ``(B, N, parts·C)`` as ``parts`` per-head views ``(B, h, N, C/h)``. ``owned``: the caller
    made ``projected`` and nothing else holds it; where autograd records it on a contiguous
    3-D tensor, the parts' gradients are then written back over it
    (:class:`_SplitHeadsOverSpent`). Same values either way."""
    if (owned and needs_grad(projected) and projected.dim() == 3
            and projected.is_contiguous() and not compiling()):
        return _SplitHeadsOverSpent.apply(projected, parts, num_heads)
    return _plain_split_heads(projected, parts, num_heads)
