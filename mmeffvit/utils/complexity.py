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
import copy
import dataclasses
import math
import os
from collections import Counter
from functools import lru_cache

import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import (addmm_flop_jit, bmm_flop_jit, conv_flop_jit,
                                           einsum_flop_jit, get_shape, linear_flop_jit)

#: operators that are traced but contain no multiply-add (element-wise, reductions, norms,
#: resampling, indexing, creation); everything else without a handle is reported as unsupported
NO_MAC_OPS = frozenset([
    # arithmetic and activations
    'aten::add', 'aten::add_', 'aten::sub', 'aten::sub_', 'aten::rsub', 'aten::mul', 'aten::mul_',
    'aten::div', 'aten::div_', 'aten::reciprocal', 'aten::pow', 'aten::sqrt', 'aten::rsqrt',
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


@contextlib.contextmanager
def reference_ops(enabled=True):
    """Run :mod:`mmeffvit.ops` on their PyTorch references inside the block (``MMEFFVIT_OPS=0``)."""
    old = os.environ.get('MMEFFVIT_OPS')
    if enabled:
        os.environ['MMEFFVIT_OPS'] = '0'
    try:
        yield
    finally:
        if old is None:
            os.environ.pop('MMEFFVIT_OPS', None)
        else:
            os.environ['MMEFFVIT_OPS'] = old


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
    # modules without own parameters (Identity, Dropout, DropPath...) trace no operators
    uncalled = sorted(
        name for name in uncalled
        if name in modules and any(True for _ in modules[name].parameters())
        and not any(name.startswith(other + '.') for other in uncalled))
    return ComplexityReport(
        macs=int(by_module.get('', 0)), params=count_params(model),
        input_shape=tuple(inputs[0].shape), by_operator={k: int(v) for k, v in
                                                         by_operator.items()},
        by_module={k: int(v) for k, v in by_module.items()}, unsupported_ops=unsupported,
        uncalled_modules=uncalled)


# --- ImageNet classification models as the official code counts them -----------------------------

#: how each family's official classifier sits on top of the backbone:
#: ``backbone``: constructor arguments giving the classifier's features (last stage, final norm);
#: ``unused_norm``: the official model builds a final LayerNorm that its forward never applies
#: (FLatten-PVT, inherited from PVT v1): counted in the parameters, not in the MACs;
#: ``dense``: constructor arguments of the dense-prediction backbone (model zoo's backbone column)
CLASSIFIER_SPECS = {
    # PVT v1: mean of stage-4 tokens, no norm applied (flatten.md sec. 2)
    'FLattenPVT': dict(backbone=dict(out_indices=(3, )), unused_norm=True),
    # PVT v2: norm4 is the backbone's own stage norm, then mean and head
    'FLattenPVTv2': dict(backbone=dict(out_indices=(3, ))),
    # Swin: final norm (here norm3) -> average pool -> head; the official 224² stage 4 is a single
    # 7×7 window without shift (official_window_rule)
    'FLattenSwin': dict(backbone=dict(out_indices=(3, ), official_window_rule=True)),
    # CSWin: final norm (norm3) -> token mean -> head
    'FLattenCSWin': dict(backbone=dict(out_indices=(3, ), out_norm=True)),
    # DeiT: final norm -> cls token -> head
    'FLattenDeiT': dict(backbone=dict(out_indices=(-1, ), out_type='cls_token', final_norm=True),
                        dense=dict(out_type='featmap', with_pyramid=True)),
}


def _last_channels(backbone):
    dims = getattr(backbone, 'embed_dims', None)
    if isinstance(dims, (list, tuple)):
        return int(dims[-1])
    if isinstance(dims, int):
        return dims
    raise AttributeError(f'{type(backbone).__name__} has no embed_dims to size the head with')


class ImageNetClassifier(nn.Module):
    """Backbone, global average pooling and a linear head: the official classification model.

    The backbone's last output is either a map ``(B, C, H, W)`` (averaged over positions) or a
    token ``(B, C)`` (DeiT's cls token). ``norm`` is built but not applied when the official
    model does the same (FLatten-PVT), so parameters match the official count.
    """

    def __init__(self, backbone, num_classes=1000, unused_norm=False):
        super().__init__()
        self.backbone = backbone
        channels = _last_channels(backbone)
        self.norm = nn.LayerNorm(channels) if unused_norm else None
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x):
        feat = self.backbone(x)[-1]
        if feat.dim() == 4:
            feat = feat.flatten(2).mean(-1)
        return self.head(feat)


def _registered_class(backbone_type):
    from mmeffvit.registry import MODELS
    name = backbone_type[len('mmeffvit.'):] if backbone_type.startswith('mmeffvit.') \
        else backbone_type
    cls = MODELS.get(name)
    if cls is None:
        from .suggest import unknown_choice_error
        MODELS.import_from_location()
        raise unknown_choice_error('backbone', backbone_type, sorted(MODELS.module_dict))
    return cls


def build_backbone(backbone_type, arch=None, dense=True, **kwargs):
    """Build a registered mmeffvit backbone (``dense``: with the model zoo's dense arguments)."""
    cls = _registered_class(backbone_type)
    args = copy.deepcopy(CLASSIFIER_SPECS.get(cls.__name__, {}).get('dense', {})) if dense else {}
    if arch is not None:
        args['arch'] = arch
    args.update(kwargs)
    return cls(**args)


def build_classifier(backbone_type, arch=None, num_classes=1000, **kwargs):
    """The official ImageNet classification model of a FLatten variant (see CLASSIFIER_SPECS)."""
    cls = _registered_class(backbone_type)
    spec = CLASSIFIER_SPECS.get(cls.__name__)
    if spec is None:
        raise KeyError(f'no classification head is defined for {cls.__name__}; known: '
                       f'{sorted(CLASSIFIER_SPECS)} (add an entry to CLASSIFIER_SPECS)')
    args = dict(copy.deepcopy(spec['backbone']), **kwargs)
    if arch is not None:
        args['arch'] = arch
    return ImageNetClassifier(cls(**args), num_classes, spec.get('unused_norm', False))


def backbone_complexity(backbone_type, arch=None, shape=(224, 224), with_head=False,
                        count_elementwise=False, **kwargs):
    """MACs and parameters of a backbone (or its ImageNet classifier) on a ``1×3×H×W`` input.

    Args:
        backbone_type (str): Registered name, e.g. ``'FLattenSwin'``.
        arch (str, optional): Variant, e.g. ``'tiny'``.
        shape (tuple[int, int]): Input ``(H, W)``.
        with_head (bool): Count the official classification model (final norm, pooling, head).
        count_elementwise (bool): See :func:`analyze`.
        **kwargs: Further backbone arguments.

    Returns:
        ComplexityReport
    """
    torch.manual_seed(0)
    if with_head:
        model = build_classifier(backbone_type, arch, **kwargs)
    else:
        model = build_backbone(backbone_type, arch, **kwargs)
    return analyze(model, torch.rand(1, 3, *shape), count_elementwise)


@lru_cache(maxsize=64)
def cached_backbone_complexity(backbone_type, arch, shape=(224, 224), with_head=False):
    """:func:`backbone_complexity` with default arguments, memoised (model zoo and tests)."""
    return backbone_complexity(backbone_type, arch, tuple(shape), with_head)


# --- whole detectors / segmentors from a config -------------------------------------------------

#: default input ``(H, W)`` per toolbox: mmdet's 1280×800 and mmseg's 2048×512 (width × height)
DEFAULT_SHAPES = {'mmdet': (800, 1280), 'mmseg': (512, 2048), 'mmpretrain': (224, 224)}


class TensorModeForward(nn.Module):
    """Runs an OpenMMLab model's ``forward(inputs, data_samples, mode='tensor')``.

    Tensor mode is backbone + neck + heads without post-processing (a detector's RPN proposals
    are still decoded to feed its RoI heads, as mmdet's ``get_flops`` counts it).
    """

    def __init__(self, model, data_samples):
        super().__init__()
        self.model = model
        self.data_samples = data_samples

    def forward(self, inputs):
        return self.model(inputs, self.data_samples, mode='tensor')


def _data_sample(scope, shape):
    meta = dict(img_shape=tuple(shape), ori_shape=tuple(shape), pad_shape=tuple(shape),
                scale_factor=(1.0, 1.0), batch_input_shape=tuple(shape))
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample
        return DetDataSample(metainfo=meta)
    if scope == 'mmseg':
        from mmseg.structures import SegDataSample
        return SegDataSample(metainfo=meta)
    from mmpretrain.structures import DataSample
    return DataSample(metainfo=meta)


def config_complexity(cfg, shape=None, count_elementwise=False):
    """MACs and parameters of the model of an mmdet / mmseg (/ mmpretrain) config.

    Builds ``cfg.model`` in the config's scope (the auxiliary head of a segmentor is removed,
    as mmseg's ``get_flops`` does: it does not run at inference), feeds one random image of
    ``shape`` through the model's data preprocessor (which may pad it, e.g. to multiples of 32)
    and traces the tensor-mode forward.

    Args:
        cfg (str | mmengine.Config): Config or its path.
        shape (tuple[int, int], optional): Input ``(H, W)``; default per scope, see
            :data:`DEFAULT_SHAPES`.
        count_elementwise (bool): See :func:`analyze`.

    Returns:
        tuple[ComplexityReport, dict]: The report (modules named ``model.backbone`` ...) and a
        summary with the scope, the padded input shape and the MACs per top-level part.
    """
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS as ROOT_MODELS
    from mmengine.registry import DefaultScope, init_default_scope
    if not isinstance(cfg, Config):
        cfg = Config.fromfile(cfg)
    scope = cfg.get('default_scope', 'mmdet')
    if scope not in DEFAULT_SHAPES:
        raise ValueError(f'unsupported default_scope {scope!r}; expected one of '
                         f'{sorted(DEFAULT_SHAPES)}')
    shape = tuple(shape or DEFAULT_SHAPES[scope])
    init_default_scope(scope)
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(scope):
        model = ROOT_MODELS.build(copy.deepcopy(cfg.model))
    if getattr(model, 'auxiliary_head', None) is not None:
        model.auxiliary_head = None
    model = revert_sync_batchnorm(model).eval()
    image = torch.randint(0, 256, (3, ) + shape, dtype=torch.uint8)
    data = model.data_preprocessor(
        dict(inputs=[image], data_samples=[_data_sample(scope, shape)]), False)
    wrapper = TensorModeForward(model, data['data_samples'])
    report = analyze(wrapper, data['inputs'], count_elementwise)
    parts = {name[len('model.'):]: macs for name, macs in report.by_module.items()
             if name.count('.') == 1 and name.startswith('model.')
             and name != 'model.data_preprocessor'}
    summary = dict(scope=scope, shape=shape, input_shape=tuple(data['inputs'].shape[-2:]),
                   parts=parts, part_params={
                       name: count_params(mod) for name, mod in model.named_children()
                       if name != 'data_preprocessor' and isinstance(mod, nn.Module)})
    return report, summary


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
