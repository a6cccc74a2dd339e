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

from .policy import ONEDNN_LINEAR, policy


def onednn_gemm() -> bool:
    """Whether the policy in force runs the CPU linears on oneDNN (else ATen's BLAS)."""
    return policy().cpu_gemm == 'onednn'


def onednn_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` may run as oneDNN's fused linear kernel (see the module)."""
    return (ONEDNN_LINEAR and x.device.type == 'cpu' and x.dtype == torch.float32
            and weight.dtype == torch.float32 and not torch.is_autocast_enabled('cpu')
            and not torch.jit.is_tracing() and not torch.compiler.is_compiling()
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
