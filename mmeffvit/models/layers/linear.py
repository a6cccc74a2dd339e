"""Linear layers whose CPU forward runs the kernel of :func:`mmeffvit.ops.linear` (oneDNN's GEMM
with the epilogue fused, or ATen's BLAS, as the kernel policy chooses): ``Linear`` (bias) and
the transformer ``Mlp`` (bias, and in inference exact GELU after ``fc1``). Why the fused kernel
and where it applies: :mod:`mmeffvit.ops.linear`.

``Mlp`` runs :func:`mmeffvit.ops.mlp` where it is the plain ``fc2(gelu(fc1(x)))``: in training
GELU and ``fc2`` store the pre-activation only and the backward writes its input gradient over
it instead of into a fresh tensor.

:func:`mlp_residual` is a block's ``x + mlp(norm(x))``, which in CPU inference runs in blocks of
rows on the block's own ``x`` instead of through a whole ``(N, 4C)`` hidden map.

:func:`project_heads` is a fused projection (``qkv``, ``kv``) split into per-head views, whose
backward writes the parts' gradients over the spent projection.

On a CPU without AVX-512 the same functions run MKL's GEMM instead of oneDNN's, which is slower
there (:func:`choose_linear_kernel`); the memory savings of the autograd functions stay.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Mlp as _TimmMlp

from ...ops.linear import fused_linear, linear, needs_grad, onednn_applies
from ...ops.linear import gelu_linear as ops_gelu_linear
from ...ops.linear import mlp as ops_mlp
from ...ops.linear import split_heads as ops_split_heads
from ...ops.policy import choose_cpu_gemm, policy
from .norm import LayerNormFP32


def choose_linear_kernel(capability=None, override=None) -> str:
    """The GEMM behind the fused path: ``'onednn'`` (``mkldnn::_linear_pointwise``) or
    ``'aten'`` (``F.linear``, MKL's GEMM; GELU in place after it).

    oneDNN's fp32 kernels beat MKL's GEMM on an AVX-512 CPU, not on an AVX2-only one (whole
    backbones measured both ways: ``docs/ops.md``). ``MMEFFVIT_LINEAR_KERNEL`` overrides."""
    current = policy()  # MMEFFVIT_LINEAR_KERNEL and the ISA, read in mmeffvit.ops.policy
    if override is None:
        override = current.cpu_gemm if current.cpu_gemm_forced else ''
    return choose_cpu_gemm(capability or current.cpu_capability, override)


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


# CPU inference of a pre-norm MLP residual (mlp_residual): a map whose (N, hidden) activation has
# at least _MLP_BLOCKED_MIN_ELEMENTS runs in blocks of rows of _MLP_BLOCK_ELEMENTS hidden values
# (an 8 MiB block stays in the L3 cache between fc1 and fc2, and no fresh (N, hidden) map is faulted
# in); smaller maps run whole, where the shorter GEMMs of blocks cost more than they save
_MLP_BLOCKED_MIN_ELEMENTS = 1 << 23
_MLP_BLOCK_ELEMENTS = 1 << 21


def mlp_residual(x, norm, mlp, drop_path=None, owned=False):
    """``x + drop_path(mlp(norm(x)))``: the pre-norm MLP half of a transformer block.

    With ``owned`` (the caller made ``x`` and nothing else holds it), in CPU inference (the
    fused kernels apply, nothing needs a gradient, no hooks, exact GELU, a plain LayerNorm) and
    on a large map, it runs in place on ``x``, one block of rows at a time: LayerNorm, fc1 +
    GELU, fc2, add. No ``(N, hidden)`` map is allocated, which lowers the inference
    allocation peak of the families whose peak lies in an MLP, and is faster under glibc's
    default malloc (the whole map would be faulted in fresh); equal in time when freed memory is
    retained (:mod:`mmeffvit.utils.allocator`, as ``tools/test.py``). Figures: ``docs/ops.md``.
    Equal to the plain expression: the same kernels on the same rows.
    """
    if owned and _mlp_blocks_apply(x, norm, mlp, drop_path):
        return _mlp_residual_blocks_(x, norm, mlp)
    y = mlp(norm(x))
    return x + (y if drop_path is None else drop_path(y))


def _mlp_blocks_apply(x, norm, mlp, drop_path):
    if not (type(mlp) is Mlp and not mlp.training and mlp._plain()
            and mlp._exact_gelu_without_norm() and type(norm) in (nn.LayerNorm, LayerNormFP32)
            and _without_hooks(mlp, norm)):
        return False
    if drop_path is not None and not (
            (isinstance(drop_path, nn.Identity) or not drop_path.training)
            and _without_hooks(drop_path)):
        return False
    fc1, fc2 = mlp.fc1, mlp.fc2
    return (x.is_contiguous() and x.dim() >= 2 and x.shape[-1] == fc1.in_features
            and x.numel() // x.shape[-1] * fc1.out_features >= _MLP_BLOCKED_MIN_ELEMENTS
            and onednn_applies(x, fc1.weight) and fc2.weight.dtype == torch.float32
            and not needs_grad(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, norm.weight,
                               norm.bias))


def _mlp_residual_blocks_(x, norm, mlp):
    fc1, fc2 = mlp.fc1, mlp.fc2
    x_2d = x.view(-1, x.shape[-1])
    step = max(64, _MLP_BLOCK_ELEMENTS // fc1.out_features)
    for start in range(0, len(x_2d), step):
        rows = x_2d[start:start + step]
        normed = F.layer_norm(rows, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
        rows.add_(fused_linear(fused_linear(normed, fc1.weight, fc1.bias, 'gelu'), fc2.weight,
                               fc2.bias))
    return x


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
