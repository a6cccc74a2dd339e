"""Linear layers whose CPU forward runs the kernel of :func:`mmeffvit.ops.linear` (oneDNN's GEMM
with the epilogue fused, or ATen's BLAS, as the kernel policy chooses): ``Linear`` (bias) and
the transformer ``Mlp`` (bias, and in inference exact GELU after ``fc1``). Why the fused kernel
and where it applies: :mod:`mmeffvit.ops.linear`.

In training the MLP's GELU and ``fc2`` are one :class:`_GeluLinear`, which stores the
pre-activation only (GELU recomputed block by block) and whose backward writes its input
gradient over it instead of into a fresh tensor.

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

from ...ops.linear import linear  # noqa: F401  (re-exported: the layers' entry point)
from ...ops.linear import (_OneDNNLinear, fused_linear, graph_kept, needs_grad, onednn_applies,
                           onednn_gemm, onednn_inference)
from ...ops.policy import choose_cpu_gemm, policy
from ...utils.tensor import split_heads
from .norm import LayerNormFP32

LINEAR_KERNELS = ('onednn', 'aten')


def choose_linear_kernel(capability=None, override=None) -> str:
    """The GEMM behind the fused path: ``'onednn'`` (``mkldnn::_linear_pointwise``) or
    ``'aten'`` (``F.linear``, MKL's GEMM; GELU in place after it).

    oneDNN's fp32 kernels beat MKL's GEMM on an AVX-512 CPU, not on an AVX2-only one (whole
    backbones measured both ways: ``docs/ops.md``). ``MMEFFVIT_LINEAR_KERNEL`` overrides."""
    current = policy()  # MMEFFVIT_LINEAR_KERNEL and the ISA, read in mmeffvit.ops.policy
    if override is None:
        override = current.cpu_gemm if current.cpu_gemm_forced else ''
    return choose_cpu_gemm(capability or current.cpu_capability, override)


def onednn_attention_applies(q, k, v, dropout=0.) -> bool:
    """Whether :func:`onednn_attention` replaces ``F.scaled_dot_product_attention`` (no mask):
    CPU fp32 inference where the linears run oneDNN (AVX-512). torch's CPU flash kernel runs its
    blocks on MKL's GEMM, slower there than oneDNN's on LaViT's global attention
    (``docs/ops.md``, attention)."""
    return (onednn_gemm() and dropout == 0. and q.dim() == 4
            and all(onednn_inference(t, k) for t in (q, v)) and q.shape[-1] == k.shape[-1]
            and k.shape[-2] == v.shape[-2])


def onednn_attention(q, k, v, scale, out=None):
    """``softmax(scale · q kᵀ) v`` for ``(B, H, N, d)`` queries and ``(B, H, M, d | d_v)`` keys
    and values, by blocks of query rows whose ``(rows, M)`` scores stay in cache (1 M elements,
    the fastest of the block sizes measured): two oneDNN GEMMs and a softmax each; no
    ``N × M`` map is written. ``out``: an optional ``(B, H, N, d_v)`` tensor or view (any
    strides) written and returned."""
    b, h, n, _ = q.shape
    m, width = k.shape[-2], v.shape[-1]
    out = q.new_empty(b, h, n, width) if out is None else out
    rows = max(1, (1 << 20) // m)
    # contiguous heads in one pass each (a strided head, e.g. a view into a qkv projection,
    # slows each of oneDNN's calls down more than the copy costs)
    query = (q if scale == 1 and q.is_contiguous()
             else torch.mul(q, scale, out=q.new_empty(q.shape)))
    key, value_t = k.contiguous(), v.transpose(-1, -2).contiguous()
    for i in range(b):
        for j in range(h):
            for start in range(0, n, rows):
                scores = fused_linear(query[i, j, start:start + rows], key[i, j], None)
                probs = torch.ops.aten._softmax.out(scores, -1, False, out=scores)
                out[i, j, start:start + rows] = fused_linear(probs, value_t[i, j], None)
    return out


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


def gelu_linear(x, fc, owned=False):
    """``fc(gelu(x))`` (exact GELU) as one :class:`_GeluLinear` where oneDNN applies and autograd
    records through it (see the class), else the two modules' own calls. ``owned``: ``x`` is
    the caller's intermediate that nothing else holds (its memory may take the gradient)."""
    if (type(fc) in (Linear, nn.Linear) and _without_hooks(fc) and onednn_applies(x, fc.weight)
            and needs_grad(x, fc.weight, fc.bias)):
        return _GeluLinear.apply(x, fc.weight, fc.bias, owned)
    return fc(F.gelu(x))


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
        return split_heads(projected, parts, num_heads)

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


def project_heads(fc, x, parts, num_heads):
    """``split_heads(fc(x), parts, num_heads)``: a fused projection (``qkv``, ``kv``) split
    into per-head views ``(B, h, N, C/h)``. Where autograd records it on a contiguous output of
    an unhooked ``fc``, the parts' gradients are written back over the spent output
    (:class:`_SplitHeadsOverSpent`); otherwise the plain split. Same values either way."""
    projected = fc(x)
    if _without_hooks(fc):  # a hook may hold the output
        return split_owned_heads(projected, parts, num_heads)
    return split_heads(projected, parts, num_heads)


def split_owned_heads(projected, parts, num_heads):
    """``split_heads(projected, parts, num_heads)`` of a projection the caller made and nothing
    else holds: where autograd records it on a contiguous tensor, the parts' gradients are
    written back over it (:class:`_SplitHeadsOverSpent`). Same values either way."""
    if needs_grad(projected) and projected.dim() == 3 and projected.is_contiguous():
        return _SplitHeadsOverSpent.apply(projected, parts, num_heads)
    return split_heads(projected, parts, num_heads)


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
                and needs_grad(x, self.fc1.weight, self.fc2.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._plain():
            return super().forward(x)
        if self._gelu_fused(x):
            x = fused_linear(x, self.fc1.weight, self.fc1.bias, 'gelu')
        elif self._gelu_in_backward(x):
            x = linear(x, self.fc1.weight, self.fc1.bias)  # fc1's output: held by nobody else
            return self.drop2(_GeluLinear.apply(x, self.fc2.weight, self.fc2.bias, True))
        else:
            x = self.act(linear(x, self.fc1.weight, self.fc1.bias))
        x = self.norm(self.drop1(x))
        return self.drop2(linear(x, self.fc2.weight, self.fc2.bias))
