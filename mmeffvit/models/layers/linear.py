"""Linear layers whose CPU forward runs oneDNN's GEMM with the epilogue fused: ``Linear``
(bias) and the transformer ``Mlp`` (bias, and in inference exact GELU after ``fc1``).

Why not torch's own ``nn.Linear`` / timm's ``Mlp``: in eager PyTorch a CPU ``addmm`` first
copies the broadcast bias into its output and then accumulates the product on it, and GELU is
one more pass over the ``(N, 4C)`` hidden map. At stage 1 of an 800×1333 image (2 threads,
measured): ``Linear(384, 96)`` 35.4 → 26.5 ms, ``Linear(96, 288)`` 27.6 → 21.1 ms, and fc1 + GELU
97 → 63 ms. ``mkldnn::_linear_pointwise`` is the kernel torch.compile's CPU backend emits for
these patterns. Results equal the eager ones to float rounding (the GEMM's summation order).

In training the same forward kernel (bias fused; GELU stays apart, its backward needs the
pre-activation) runs inside :class:`_OneDNNLinear`, whose backward is torch's: two GEMMs and
the bias sum; the MLP's GELU and ``fc2`` are one :class:`_GeluLinear`, whose backward writes
its input gradients over the saved activation instead of into fresh tensors.

The fused path runs only where it applies: CPU, float32, no autocast, tracing, compiling,
functorch transform or dispatch mode (``FlopCounterMode`` and the complexity tools see the plain
operators).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Mlp as _TimmMlp
from torch.utils._python_dispatch import _get_current_dispatch_mode

_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                                   '_linear_pointwise')


def onednn_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` may run as oneDNN's fused linear kernel (see the module)."""
    return (_ONEDNN_LINEAR and x.device.type == 'cpu' and x.dtype == torch.float32
            and weight.dtype == torch.float32 and not torch.is_autocast_enabled('cpu')
            and not torch.jit.is_tracing() and not torch.compiler.is_compiling()
            and _get_current_dispatch_mode() is None
            and not torch._C._are_functorch_transforms_active())


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def onednn_inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused kernel applies and nothing needs a gradient."""
    return onednn_applies(x, weight) and not _needs_grad(x, weight)


def fused_linear(x, weight, bias, activation='none'):
    """oneDNN's ``activation(x @ weightᵀ + bias)`` (``'none'`` or ``'gelu'``, exact erf)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, activation, [],
                                              'none' if activation == 'gelu' else '')


class _OneDNNLinear(torch.autograd.Function):
    """``x @ weightᵀ + bias`` with the bias fused into oneDNN's forward GEMM; the backward is
    the one of ``addmm`` (``dx = dy·W``, ``dW = dyᵀ·x``, ``db = Σ dy``), written with
    differentiable operators so that double backward works."""

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
            grad_x = grad_out.matmul(weight)
        grad_2d = grad_out.reshape(-1, grad_out.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_weight = grad_2d.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_2d.sum(0)
        return grad_x, grad_weight, grad_bias


def _graph_kept() -> bool:
    """Whether the running backward keeps the graph (``retain_graph``/``create_graph``), so
    that saved tensors must stay intact; True where torch cannot tell."""
    keep_graph = getattr(torch._C._autograd, '_get_current_graph_task_keep_graph', None)
    return True if keep_graph is None else bool(keep_graph())


class _GeluLinear(_OneDNNLinear):
    """``gelu(h) @ weightᵀ + bias`` (exact GELU; the MLP's activation and ``fc2``) whose
    backward writes fc2's input gradient ``dO·W`` and then GELU's gradient over the saved
    ``gelu(h)`` once fc2's weight gradient has read it, instead of into fresh ``(N, 4C)``
    tensors: on the CPU a fresh tensor this large is faulted in page by page by the kernel that
    writes it first. In a FLatten-Swin-T training step at 800×1333 (2 threads, profiled) the
    ``dO·W`` GEMMs took 1.13 s at 17-38 GMAC/s into fresh outputs and 0.50 s at 50-70 into the
    saved ones. Where the graph is kept for another backward (``retain_graph``), or for double
    backward, the saved tensor stays intact and fresh tensors are used."""

    @staticmethod
    def forward(ctx, hidden, weight, bias):
        act = F.gelu(hidden)
        ctx.save_for_backward(hidden, act, weight)
        ctx.has_bias = bias is not None
        return fused_linear(act, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        hidden, act, weight = ctx.saved_tensors
        grad_needed = ctx.needs_input_grad[0]
        differentiable = torch.is_grad_enabled()  # double backward
        overwrite = not differentiable and not _graph_kept() and act.is_contiguous()
        # the weight gradient reads act before dO·W may be written over it
        grad_act, grad_weight, grad_bias = _OneDNNLinear._grads(
            ctx, grad_out, act, weight, grad_needed and not overwrite)
        if grad_needed and overwrite:
            grad_2d = grad_out.reshape(-1, grad_out.shape[-1])
            grad_act = torch.mm(grad_2d, weight, out=act.view(-1, act.shape[-1])).view_as(act)
        if grad_act is None:
            return None, grad_weight, grad_bias
        if differentiable:
            grad_hidden = torch.ops.aten.gelu_backward(grad_act, hidden)
        else:  # grad_act is this backward's own tensor (fresh, or the saved act)
            grad_hidden = torch.ops.aten.gelu_backward.grad_input(grad_act, hidden,
                                                                  grad_input=grad_act)
        return grad_hidden, grad_weight, grad_bias


def linear(x, weight, bias=None):
    """``F.linear`` with oneDNN's fused forward where it applies (CPU fp32, see the module),
    under autograd too."""
    if not onednn_applies(x, weight):
        return F.linear(x, weight, bias)
    if _needs_grad(x, weight, bias):
        return _OneDNNLinear.apply(x, weight, bias)
    return fused_linear(x, weight, bias)


def gelu_linear(x, fc):
    """``fc(gelu(x))`` (exact GELU) as one :class:`_GeluLinear` where oneDNN applies and autograd
    records through it (see the class), else the two modules' own calls."""
    if (type(fc) in (Linear, nn.Linear) and _without_hooks(fc) and onednn_applies(x, fc.weight)
            and _needs_grad(x, fc.weight, fc.bias)):
        return _GeluLinear.apply(x, fc.weight, fc.bias)
    return fc(F.gelu(x))


def _without_hooks(*modules):
    """The fused paths skip the submodules' ``__call__``: only where nothing hooks them."""
    from torch.nn.modules import module as m
    return not (m._global_forward_hooks or m._global_forward_pre_hooks) and not any(
        mod._forward_hooks or mod._forward_pre_hooks for mod in modules)


class Linear(nn.Linear):
    """``nn.Linear`` (same arguments, parameters and initialisation) with the bias fused into
    oneDNN's forward GEMM on the CPU (:func:`linear`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class Mlp(_TimmMlp):
    """timm's ``Mlp`` (same arguments, parameters and training behaviour) whose two linears run
    :func:`linear`, and in CPU inference ``fc1`` + GELU one fused oneDNN kernel (not with a
    hidden norm or another activation, or ``use_conv``)."""

    def _plain(self) -> bool:
        return (type(self.fc1) is nn.Linear and type(self.fc2) is nn.Linear
                and _without_hooks(self.fc1, self.fc2))

    def _exact_gelu_without_norm(self) -> bool:
        return (isinstance(self.norm, nn.Identity) and type(self.act) is nn.GELU
                and self.act.approximate == 'none')

    def _gelu_fused(self, x: torch.Tensor) -> bool:
        return (not self.training and onednn_inference(x, self.fc1.weight)
                and self._exact_gelu_without_norm())

    def _gelu_in_backward(self, x: torch.Tensor) -> bool:
        """Training: GELU and fc2 one :class:`_GeluLinear` (nothing between them)."""
        drop1 = self.drop1
        return (self._exact_gelu_without_norm()
                and (isinstance(drop1, nn.Identity) or not self.training
                     or (type(drop1) is nn.Dropout and drop1.p == 0))
                and onednn_applies(x, self.fc2.weight)
                and _needs_grad(x, self.fc1.weight, self.fc2.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._plain():
            return super().forward(x)
        if self._gelu_fused(x):
            x = fused_linear(x, self.fc1.weight, self.fc1.bias, 'gelu')
        elif self._gelu_in_backward(x):
            x = linear(x, self.fc1.weight, self.fc1.bias)
            return self.drop2(_GeluLinear.apply(x, self.fc2.weight, self.fc2.bias))
        else:
            x = self.act(linear(x, self.fc1.weight, self.fc1.bias))
        x = self.norm(self.drop1(x))
        return self.drop2(linear(x, self.fc2.weight, self.fc2.bias))
