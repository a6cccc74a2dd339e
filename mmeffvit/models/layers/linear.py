"""Linear layers whose CPU forward runs the kernel of :func:`mmeffvit.ops.linear` (oneDNN's GEMM
with the epilogue fused, or ATen's BLAS, as the kernel policy chooses): ``Linear`` (bias) and
the transformer ``Mlp`` (bias, and in inference exact GELU after ``fc1``). Why the fused kernel
and where it applies: :mod:`mmeffvit.ops.linear`.

``Mlp`` runs :func:`mmeffvit.ops.mlp` where it is the plain ``fc2(gelu(fc1(x)))``: in training
GELU and ``fc2`` store the pre-activation only and the backward writes its input gradient over
it instead of into a fresh tensor.

:func:`mlp_residual` is a block's ``x + mlp(norm(x))``, which in CPU inference may run in blocks
of rows on the block's own ``x`` instead of through a whole ``(N, 4C)`` hidden map
(:func:`mmeffvit.ops.mlp_residual`).

:func:`project_heads` is a fused projection (``qkv``, ``kv``) split into per-head views, whose
backward writes the parts' gradients over the spent projection.

On a CPU without AVX-512 the same functions run MKL's GEMM instead of oneDNN's, which is slower
there (:func:`mmeffvit.ops.policy.choose_cpu_gemm`); the memory savings of the autograd
functions stay.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Mlp as _TimmMlp

from ...ops.linear import gelu_linear as ops_gelu_linear
from ...ops.linear import linear
from ...ops.linear import mlp as ops_mlp
from ...ops.linear import mlp_residual as ops_mlp_residual
from ...ops.linear import split_heads as ops_split_heads
from .norm import LayerNormFP32


def gelu_linear(x, fc, owned=False):
    """``fc(gelu(x))`` (exact GELU): :func:`mmeffvit.ops.gelu_linear` on ``fc``'s weights where
    ``fc`` is a plain linear that nothing hooks, else the module's own call. ``owned``: ``x`` is
    the caller's intermediate that nothing else holds (its memory may take the gradient)."""
    if type(fc) in (Linear, nn.Linear) and _without_hooks(fc):
        return ops_gelu_linear(x, fc.weight, fc.bias, owned)
    return fc(F.gelu(x))


def project_heads(fc, x, parts, num_heads):
    """``split_heads(fc(x), parts, num_heads)``: a fused projection (``qkv``, ``kv``) split
    into per-head views ``(B, h, N, C/h)``. Where autograd records it on a contiguous output of
    an unhooked ``fc``, the parts' gradients are written back over the spent output
    (:class:`_SplitHeadsOverSpent`); otherwise the plain split. Same values either way."""
    projected = fc(x)
    return ops_split_heads(projected, parts, num_heads,
                           owned=_without_hooks(fc))  # a hook may hold the output


def split_owned_heads(projected, parts, num_heads):
    """:func:`mmeffvit.ops.split_heads` of a projection the caller made and nothing else holds
    (its memory may take the parts' gradients). Same values as the plain split."""
    return ops_split_heads(projected, parts, num_heads, owned=True)


def mlp_residual(x, norm, mlp, drop_path=None, owned=False):
    """``x + drop_path(mlp(norm(x)))``: the pre-norm MLP half of a transformer block.

    Where the modules are the plain ones in inference (an unhooked :class:`Mlp` with exact GELU
    and no hidden norm, a LayerNorm, an inactive drop path), the weights go to
    :func:`mmeffvit.ops.mlp_residual`, which with ``owned`` (the caller made ``x`` and nothing
    else holds it) may run in place on ``x`` in blocks of rows; otherwise the modules' calls.
    Same values either way."""
    if owned and _plain_in_inference(x, norm, mlp, drop_path):
        fc1, fc2 = mlp.fc1, mlp.fc2
        return ops_mlp_residual(x, norm.weight, norm.bias, fc1.weight, fc1.bias, fc2.weight,
                                fc2.bias, norm_eps=norm.eps, owned=True,
                                norm_fp32=type(norm) is LayerNormFP32)
    y = mlp(norm(x))
    return x + (y if drop_path is None else drop_path(y))


def _plain_in_inference(x, norm, mlp, drop_path):
    """Whether ``mlp(norm(x))`` is ``fc2(gelu(fc1(layer_norm(x))))`` with nothing between
    and nothing hooked, and the drop path is the identity."""
    if not (type(mlp) is Mlp and not mlp.training and mlp._plain()
            and mlp._exact_gelu_without_norm() and type(norm) in (nn.LayerNorm, LayerNormFP32)
            and tuple(norm.normalized_shape) == tuple(x.shape[-1:])
            and _without_hooks(mlp, norm)):
        return False
    return drop_path is None or (
        (isinstance(drop_path, nn.Identity) or not drop_path.training)
        and _without_hooks(drop_path))


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

    def _drop1_inactive(self) -> bool:
        drop1 = self.drop1
        return (isinstance(drop1, nn.Identity) or not self.training
                or (type(drop1) is nn.Dropout and drop1.p == 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._plain():
            return super().forward(x)
        if self._exact_gelu_without_norm() and self._drop1_inactive():
            return self.drop2(ops_mlp(x, self.fc1.weight, self.fc1.bias, self.fc2.weight,
                                      self.fc2.bias))
        x = self.act(linear(x, self.fc1.weight, self.fc1.bias))
        x = self.norm(self.drop1(x))
        return self.drop2(linear(x, self.fc2.weight, self.fc2.bias))
