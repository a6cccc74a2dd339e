"""Linear layers whose CPU inference runs oneDNN's GEMM with the epilogue fused: ``Linear``
(bias) and the transformer ``Mlp`` (bias + exact GELU after ``fc1``).

Why not torch's own ``nn.Linear`` / timm's ``Mlp``: in eager PyTorch a CPU ``addmm`` first
copies the broadcast bias into its output and then accumulates the product on it, and GELU is
one more pass over the ``(N, 4C)`` hidden map. At stage 1 of an 800×1333 image (2 threads,
measured): ``Linear(384, 96)`` 35.4 → 26.5 ms, ``Linear(96, 288)`` 27.6 → 21.1 ms, and fc1 + GELU
97 → 63 ms. ``mkldnn::_linear_pointwise`` is the kernel torch.compile's CPU backend emits for
these patterns. Results equal the eager ones to float rounding (the GEMM's summation order).

The fused path runs only where it applies: CPU, float32, no autograd (training, or any input
or weight that needs a gradient, takes torch's path), no autocast, tracing, compiling or
dispatch mode (``FlopCounterMode`` and the complexity tools see the plain operators).
"""
import torch
import torch.nn as nn
from timm.layers import Mlp as _TimmMlp
from torch.utils._python_dispatch import _get_current_dispatch_mode

_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                                   '_linear_pointwise')


def onednn_inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` may run as oneDNN's fused linear kernel (see the module)."""
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return (_ONEDNN_LINEAR and not needs_grad and x.device.type == 'cpu'
            and x.dtype == torch.float32 and weight.dtype == torch.float32
            and not torch.is_autocast_enabled('cpu') and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None)


def fused_linear(x, weight, bias, activation='none'):
    """oneDNN's ``activation(x @ weightᵀ + bias)`` (``'none'`` or ``'gelu'``, exact erf)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, activation, [],
                                              'none' if activation == 'gelu' else '')


def _without_hooks(*modules):
    """The fused paths skip the submodules' ``__call__``: only where nothing hooks them."""
    from torch.nn.modules import module as m
    return not (m._global_forward_hooks or m._global_forward_pre_hooks) and not any(
        mod._forward_hooks or mod._forward_pre_hooks for mod in modules)


class Linear(nn.Linear):
    """``nn.Linear`` (same arguments, parameters and initialisation) with the bias fused into
    oneDNN's GEMM in CPU inference."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if onednn_inference(x, self.weight):
            return fused_linear(x, self.weight, self.bias)
        return super().forward(x)


class Mlp(_TimmMlp):
    """timm's ``Mlp`` (same arguments, parameters and training behaviour) with ``fc1`` + GELU
    and ``fc2`` each one fused oneDNN kernel in CPU inference (not with a hidden norm or
    another activation, or ``use_conv``)."""

    def _fused(self, x: torch.Tensor) -> bool:
        return (not self.training and onednn_inference(x, self.fc1.weight)
                and type(self.fc1) is nn.Linear and type(self.fc2) is nn.Linear
                and isinstance(self.norm, nn.Identity) and type(self.act) is nn.GELU
                and self.act.approximate == 'none' and _without_hooks(self.fc1, self.fc2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._fused(x):
            return super().forward(x)
        x = fused_linear(x, self.fc1.weight, self.fc1.bias, 'gelu')
        return self.drop2(fused_linear(self.drop1(x), self.fc2.weight, self.fc2.bias))
