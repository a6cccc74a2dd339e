"""The transformer MLP, with ``fc1`` and GELU as one oneDNN kernel in CPU inference."""
import torch
import torch.nn as nn
from timm.layers import Mlp as _TimmMlp
from torch.utils._python_dispatch import _get_current_dispatch_mode


def _has_fused_linear_gelu() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                            '_linear_pointwise')


_FUSED_LINEAR_GELU = _has_fused_linear_gelu()


class Mlp(_TimmMlp):
    """timm's ``Mlp`` (same arguments, parameter names and training behaviour).

    Why not timm's own: in eager PyTorch ``fc1`` writes its ``(N, 4C)`` output, then GELU reads
    and writes it again; at stage 1 of an 800×1333 image that pass took 41 ms next to fc1's
    56 ms (2 threads, measured). In CPU inference without autograd the exact (erf) GELU runs
    in the epilogue of oneDNN's GEMM (``mkldnn::_linear_pointwise``, the kernel torch.compile's
    CPU backend emits for this pattern): equal to the eager result to float rounding. Training,
    autocast, tracing, compiling and dispatch modes (e.g. ``FlopCounterMode``, which does not
    know the kernel), non-GELU activations and a hidden norm take timm's path.
    """

    def _fused(self, x: torch.Tensor) -> bool:
        needs_grad = torch.is_grad_enabled() and (x.requires_grad
                                                  or self.fc1.weight.requires_grad)
        return (_FUSED_LINEAR_GELU and not self.training and not needs_grad
                and x.device.type == 'cpu' and x.dtype == torch.float32
                and isinstance(self.fc1, nn.Linear) and isinstance(self.norm, nn.Identity)
                and type(self.act) is nn.GELU and self.act.approximate == 'none'
                and not torch.is_autocast_enabled('cpu') and not torch.jit.is_tracing()
                and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._fused(x):
            return super().forward(x)
        x = torch.ops.mkldnn._linear_pointwise(x, self.fc1.weight, self.fc1.bias, 'gelu', [],
                                               'none')
        return self.drop2(self.fc2(self.drop1(x)))
