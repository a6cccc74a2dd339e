"""Parameters and multiply-accumulates (MACs) of mmeffvit models, counted by tracing.

Counting convention (fvcore / mmengine): **one MAC = one multiply-add**, reported as GMACs. Papers,
the FLatten paper included (sec. 5, Fig. 1/5), call this number "FLOPs". Only operators made of
multiply-adds are counted:

* ``linear`` / ``addmm`` / ``mm`` / ``bmm`` / ``baddbmm`` / ``matmul`` / ``einsum`` and
  convolutions (grouped, depthwise and transposed ones included), with mmengine's handles except
  ``matmul``, whose handle here follows broadcasting on both sides;
* ``F.scaled_dot_product_attention``, which mmengine skips: ``B·h·N·n·d`` for ``QKᵀ`` plus
  ``B·h·N·n·d_v`` for the product with V;
* the compiled linear-attention operator of :mod:`mmeffvit.ops` (a ``prim::PythonOp`` that
  hides its products from the trace): ``B·h·N·d`` for ``q·mean(k)``, ``B·h·n·d·e`` for ``KᵀV``
  and ``B·h·N·d·e`` for ``Q(KᵀV)``, the same three products the PyTorch reference spells out
  (also for the fused focusing + attention operator, which receives head views to show h).
  By default the references are traced instead (``use_reference_ops``), so the breakdown does
  not depend on whether the operators are built.

Element-wise work is **not** counted: FLatten's focusing function (ReLU, softplus, powers and
norms), softmax, LayerNorm / BatchNorm / GroupNorm, activations, additions, pooling and the
resizing of position tensors. This is the convention that reproduces the official counts
(flatten.md sec. 3, 6). ``count_elementwise=True`` switches to mmengine's defaults, which also
charge norms (5 per element), up-sampling and pooling, as the toolboxes' own ``get_flops`` do.

Every traced operator is either counted, known to have no multiply-adds (:data:`NO_MAC_OPS`),
or reported in :attr:`ComplexityReport.unsupported_ops`; an attention matmul cannot disappear
silently. Counting needs real tensors (``torch.jit`` tracing does not run on the meta device).
"""
import contextlib
import dataclasses
import math
from collections import Counter

import torch
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import (addmm_flop_jit, bmm_flop_jit, conv_flop_jit,
                                           einsum_flop_jit, get_shape, linear_flop_jit)

#: operators that are traced but contain no multiply-add (element-wise, reductions, norms,
#: resampling, indexing, creation); everything else without a handle is reported as unsupported
NO_MAC_OPS = frozenset([
    # arithmetic and activations
    'aten::add', 'aten::add_', 'aten::sub', 'aten::sub_', 'aten::rsub', 'aten::mul', 'aten::mul_',
    'aten::addcmul', 'aten::div', 'aten::div_', 'aten::reciprocal', 'aten::pow', 'aten::sqrt',
    'aten::rsqrt',
    'aten::exp', 'aten::log', 'aten::log2', 'aten::neg', 'aten::abs', 'aten::sign', 'aten::erf',
    'aten::sin', 'aten::cos', 'aten::ceil', 'aten::round', 'aten::clamp_min', 'aten::clamp_max',
    'aten::minimum', 'aten::maximum', 'aten::sigmoid', 'aten::sigmoid_', 'aten::tanh',
    'aten::softplus', 'aten::gelu', 'aten::silu', 'aten::silu_', 'aten::hardswish',
    'aten::hardsigmoid', 'aten::elu', 'aten::leaky_relu', 'aten::hardtanh', 'aten::relu6',
    # reductions, softmax and normalisations
    'aten::softmax', 'aten::log_softmax', 'aten::mean', 'aten::sum', 'aten::cumsum', 'aten::amax',
    'aten::argmax', 'aten::linalg_vector_norm', 'aten::norm', 'aten::frobenius_norm',
    'aten::layer_norm', 'aten::group_norm', 'aten::batch_norm', 'aten::instance_norm',
    # pooling, resampling, padding
    'aten::upsample_nearest2d', 'aten::upsample_bilinear2d', 'aten::upsample_bicubic2d',
    'aten::upsample_linear1d', 'aten::adaptive_avg_pool1d', 'aten::adaptive_avg_pool2d',
    'aten::avg_pool2d', 'aten::max_pool2d', 'aten::grid_sampler', 'aten::pad',
    'aten::reflection_pad2d', 'aten::replication_pad2d', 'aten::im2col', 'aten::col2im',
    # comparisons, selection, creation, layout
    'aten::ne', 'aten::lt', 'aten::le', 'aten::where', 'aten::masked_fill_', 'aten::fill_',
    'aten::zero_', 'aten::sort', 'aten::topk', 'aten::repeat', 'aten::tile', 'aten::expand_as',
    'aten::view_as', 'aten::index_select', 'aten::scatter', 'aten::scatter_', 'aten::meshgrid',
    'aten::linspace', 'aten::new_ones', 'aten::ones_like', 'aten::empty_like', 'aten::clone',
    'aten::flip', 'aten::unflatten', 'aten::movedim', 'aten::numel', 'aten::feature_dropout',
    'aten::masked_select', 'aten::all', 'aten::any', 'aten::logical_and', 'aten::logical_not',
    'aten::nonzero_numpy', 'aten::diagonal', 'aten::lift_fresh',
    'aten::sqrt_', 'aten::exp_', 'aten::log_', 'aten::clamp_min_',
    # compiled operators without products: FLatten's fused focusing function, mmcv / torchvision
    # RoI sampling and NMS of the detectors' heads
    'prim::PythonOp.FocusFeatureMap', 'prim::PythonOp.RoIAlignFunction', 'prim::PythonOp.NMSop',
    'torchvision::nms', 'torchvision::roi_align',
])

#: element-wise operators that mmengine's defaults charge (``count_elementwise=True`` keeps them)
_MMENGINE_ELEMENTWISE = ('aten::batch_norm', 'aten::group_norm', 'aten::layer_norm',
                         'aten::instance_norm', 'aten::upsample_nearest2d',
                         'aten::upsample_bilinear2d', 'aten::adaptive_avg_pool2d',
                         'aten::grid_sampler')


def _shapes(inputs, count):
    """Shapes of the first ``count`` tensor inputs of a traced node (skipping non-tensors)."""
    out = []
    for value in inputs:
        shape = get_shape(value)
        if shape is not None:
            out.append(list(shape))
        if len(out) == count:
            break
    if len(out) < count:
        raise ValueError(f'expected {count} tensor inputs with known shapes, got {out}')
    return out


def matmul_macs(inputs, outputs):
    """``aten::matmul`` with NumPy semantics: 1-D promotion and broadcast batch dimensions."""
    a, b = _shapes(inputs, 2)
    if len(a) == 1:
        a = [1] + a
    if len(b) == 1:
        b = b + [1]
    if a[-1] != b[-2]:
        raise ValueError(f'matmul shapes do not fit: {a} @ {b}')
    batch = torch.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return math.prod(batch) * a[-2] * a[-1] * b[-1]


def baddbmm_macs(inputs, outputs):
    """``aten::baddbmm(self, batch1, batch2, ...)``: the batched product only."""
    b1, b2 = [list(get_shape(v)) for v in inputs[1:3]]
    return b1[0] * b1[1] * b1[2] * b2[2]


def sdpa_macs(inputs, outputs):
    """``aten::scaled_dot_product_attention``: ``QKᵀ`` and ``softmax(·)V`` (softmax excluded).

    For queries ``(..., N, d)``, keys ``(..., n, d)`` and values ``(..., n, d_v)``: every query
    row meets every key, ``prod(...)·N·n·(d + d_v)``; the leading dimensions are those of the
    queries (grouped-query attention shares keys between query heads, not products).
    """
    q, k, v = _shapes(inputs, 3)
    rows = math.prod(q[:-1])
    return rows * k[-2] * (q[-1] + v[-1])


def linear_attention_macs(inputs, outputs):
    """Compiled kv-first linear attention, ``q (B,h,N,d)``, ``k (B,h,n,d)``, ``v (B,h,n,e)``.

    Same products as :func:`mmeffvit.ops.linear_attention_ref`: the normaliser ``q·mean(k)``
    (``B·h·N·d``; the mean itself is a reduction), the state ``KᵀV`` (``B·h·n·d·e``) and the
    output ``Q(KᵀV)`` (``B·h·N·d·e``). Scaling by a temperature is element-wise.
    """
    q, k, v = _shapes(inputs, 3)
    heads, n_q, d = math.prod(q[:-2]), q[-2], q[-1]
    n_k, e = k[-2], v[-1]
    return Counter(linear_attention=heads * (n_q * d + n_k * d * e + n_q * d * e))


def focused_linear_attention_macs(inputs, outputs):
    """Compiled fused FLatten attention on head views ``q (B,N,h,d)``, ``k (B,n,h,d)``,
    ``v (B,n,h,e)``: the three products of :func:`linear_attention_macs` (the focusing function
    is element-wise)."""
    q, k, v = _shapes(inputs, 3)
    batch_heads, n_q, d = q[0] * q[2], q[1], q[3]
    n_k, e = k[1], v[3]
    return Counter(linear_attention=batch_heads * (n_q * d + n_k * d * e + n_q * d * e))


def no_macs(inputs, outputs):
    """Handle of compiled operators without products (``prim::PythonOp`` cannot be ignored)."""
    return Counter()


#: handles of the products; with ``count_elementwise`` they are added to mmengine's defaults
MAC_HANDLES = {
    'aten::linear': linear_flop_jit,
    'aten::addmm': addmm_flop_jit,
    'aten::mm': matmul_macs,
    'aten::bmm': bmm_flop_jit,
    'aten::baddbmm': baddbmm_macs,
    'aten::matmul': matmul_macs,
    'aten::einsum': einsum_flop_jit,
    'aten::_convolution': conv_flop_jit,
    'aten::scaled_dot_product_attention': sdpa_macs,
    'prim::PythonOp.LinearAttentionFunction': linear_attention_macs,
    'prim::PythonOp.FocusedLinearAttentionFunction': focused_linear_attention_macs,
}


@dataclasses.dataclass
class ComplexityReport:
    """What :func:`analyze` measured for one model and input.

    Attributes:
        macs (int): Multiply-accumulates of the whole forward.
        params (int): Parameters of the model (all of them, trainable or not).
        input_shape (tuple): Shape of the traced input.
        by_operator (dict): MACs per counted operator kind (``linear``, ``conv``, ``matmul``...).
        by_module (dict): MACs per named submodule (``''`` is the whole model).
        unsupported_ops (dict): Traced operators neither counted nor known to be MAC-free, with
            how often they ran. Empty for every mmeffvit backbone.
        uncalled_modules (list): Submodules holding parameters that the forward never called.
    """
    macs: int
    params: int
    input_shape: tuple
    by_operator: dict
    by_module: dict
    unsupported_ops: dict
    uncalled_modules: list

    @property
    def gmacs(self):
        return self.macs / 1e9

    @property
    def mparams(self):
        return self.params / 1e6


def count_params(model):
    """Number of parameters of ``model`` (shared tensors once)."""
    return sum(p.numel() for p in model.parameters())


def make_analyzer(model, inputs, count_elementwise=False):
    """A :class:`mmengine.analysis.FlopAnalyzer` with this module's convention and handles."""
    analyzer = FlopAnalyzer(model, inputs)
    if not count_elementwise:
        analyzer.clear_op_handles()  # mmengine's defaults also charge norms, resizing, pooling
    analyzer.set_op_handle(**MAC_HANDLES)
    handled = set(MAC_HANDLES) | (set(_MMENGINE_ELEMENTWISE) if count_elementwise else set())
    # mmengine ignores operators by their plain kind, which is 'prim::PythonOp' for every
    # compiled autograd function: those get a handle that counts nothing instead
    analyzer.set_op_handle(**{name: no_macs if name.startswith('prim::PythonOp.') else None
                              for name in NO_MAC_OPS - handled})
    analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    return analyzer.tracer_warnings('none')


def reference_ops(enabled=True):
    """Run :mod:`mmeffvit.ops` on their PyTorch references inside the block
    (:func:`mmeffvit.ops.use_reference`); ``enabled=False`` leaves the policy as it is."""
    from mmeffvit.ops import use_reference
    return use_reference() if enabled else contextlib.nullcontext()


def _fused(modules, name):
    """Whether module ``name`` is one of its parent's ``fused_modules`` (parameter holders
    whose parameters an op of the parent reads)."""
    parent, _, child = name.rpartition('.')
    return child in getattr(modules.get(parent), 'fused_modules', ())


def analyze(model, inputs, count_elementwise=False, use_reference_ops=True):
    """Trace ``model(*inputs)`` once (eval mode, no autograd) and count its MACs.

    Args:
        model (nn.Module): Any module whose forward takes tensors.
        inputs (Tensor | tuple[Tensor]): Example inputs (real tensors; their values do not
            matter except where control flow depends on them, e.g. a detector's proposals).
        count_elementwise (bool): Use mmengine's default charges for norms, resizing and pooling.
        use_reference_ops (bool): Trace the PyTorch references of mmeffvit's compiled operators.
            They perform the same products (the tests check that both paths give the same
            count); the references keep the operator breakdown independent of whether the
            operators are built, and trace faster on a CPU. With False the compiled operators run
            and are counted by their handles.

    Returns:
        ComplexityReport
    """
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs, )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), reference_ops(use_reference_ops):
            analyzer = make_analyzer(model, inputs, count_elementwise)
            by_module = dict(analyzer.by_module())
            by_operator = dict(analyzer.by_operator())
            unsupported = dict(analyzer.unsupported_ops())
            uncalled = analyzer.uncalled_modules()
    finally:
        model.train(was_training)
    modules = dict(model.named_modules())
    # modules without own parameters (Identity, Dropout, DropPath...) trace no operators;
    # a parent's ``fused_modules`` hold parameters that an op reads without calling them
    uncalled = sorted(
        name for name in uncalled
        if name in modules and any(True for _ in modules[name].parameters())
        and not any(name.startswith(other + '.') for other in uncalled)
        and not _fused(modules, name))
    return ComplexityReport(
        macs=int(by_module.get('', 0)), params=count_params(model),
        input_shape=tuple(inputs[0].shape), by_operator={k: int(v) for k, v in
                                                         by_operator.items()},
        by_module={k: int(v) for k, v in by_module.items()}, unsupported_ops=unsupported,
        uncalled_modules=uncalled)


def format_report(report, title=None, debug=False):
    """Human-readable lines for a :class:`ComplexityReport` (GMACs, params, optionally details)."""
    lines = [] if title is None else [title]
    shape = '×'.join(str(s) for s in report.input_shape)
    lines.append(f'input shape : {shape}')
    lines.append(f'params      : {report.mparams:.2f} M ({report.params:,})')
    lines.append(f'GMACs       : {report.gmacs:.2f} ({report.macs:,} multiply-adds; papers call '
                 'these FLOPs)')
    if debug:
        ops = Counter(report.by_operator)
        lines.append('MACs by operator: ' + ', '.join(
            f'{k} {v / 1e9:.3f}G' for k, v in ops.most_common()))
        lines.append(f'unsupported ops (neither counted nor known to be MAC-free): '
                     f'{report.unsupported_ops or "none"}')
        lines.append(f'uncalled modules with parameters: {report.uncalled_modules or "none"}')
    return lines
