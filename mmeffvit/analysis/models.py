"""The models that :mod:`mmeffvit.analysis.complexity` counts: backbones, the official ImageNet
classifiers of every family (whose published counts include the head) and whole detectors /
segmentors built from a config.
"""
import copy
from functools import lru_cache

import torch
import torch.nn as nn

from ..utils import unknown_choice_error
from .complexity import analyze, count_params

# --- ImageNet classification models as the official code counts them -----------------------------

#: how each family's official classifier sits on top of the backbone:
#: ``backbone``: constructor arguments giving the classifier's features (last stage, final norm);
#: ``unused_norm``: the official model builds a final LayerNorm that its forward never applies
#: (FLatten-PVT, inherited from PVT v1): counted in the parameters, not in the MACs;
#: ``dense``: constructor arguments of the dense-prediction backbone (model zoo's backbone column);
#: ``head``: ``'linear'`` (default) or ``'care'`` (see :class:`ImageNetClassifier`)
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
    # LaViT (no official code): PVT v1 layout with the stage-4 out-norm as final norm, at the
    # paper's dense less attention (docs: configs/lavit/README.md, "Counts")
    'LaViT': dict(backbone=dict(out_indices=(3, ), la_mode='dense')),
    # CARE: the released 1024/1536-channel stage-4 map -> GAP -> GELU -> LayerNorm -> Linear,
    # twice (head and dist_head, averaged at evaluation; care.md sec. 5)
    'CARE': dict(backbone=dict(out_indices=(3, )), head='care'),
    # L2ViT: final norm (norm3) -> mean -> head
    'L2ViT': dict(backbone=dict(out_indices=(3, ))),
    # Focal: final norm (norm3) -> average pool -> head; the 224² model has no stage-4
    # surroundings (its 7×7 map is one window), so the dense default expand size 3 is off there
    'FocalTransformer': dict(backbone=dict(out_indices=(3, ), expand_sizes=(3, 3, 3, 0))),
}


def _last_channels(backbone):
    out = getattr(backbone, 'out_channels', None)  # CARE: the expanded stage-4 map
    if isinstance(out, (list, tuple)):
        return int(out[-1])
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
    model does the same (FLatten-PVT), so parameters match the official count. ``head='care'``
    is CARE's pair of heads (``head`` and the DeiT-style ``dist_head``, logits averaged), each
    GELU -> LayerNorm (eps 1e-6) -> Linear after the pooling.
    """

    def __init__(self, backbone, num_classes=1000, unused_norm=False, head='linear'):
        super().__init__()
        if head not in ('linear', 'care'):
            raise unknown_choice_error('head', head, ['linear', 'care'])
        self.backbone = backbone
        channels = _last_channels(backbone)
        self.norm = nn.LayerNorm(channels) if unused_norm else None
        if head == 'care':
            self.head, self.dist_head = (nn.Sequential(
                nn.GELU(), nn.LayerNorm(channels, eps=1e-6), nn.Linear(channels, num_classes))
                for _ in range(2))
        else:
            self.head, self.dist_head = nn.Linear(channels, num_classes), None

    def forward(self, x):
        feat = self.backbone(x)[-1]
        if feat.dim() == 4:
            feat = feat.flatten(2).mean(-1)
        if self.dist_head is None:
            return self.head(feat)
        return (self.head(feat) + self.dist_head(feat)) / 2


def _registered_class(backbone_type):
    from mmeffvit.registry import MODELS
    name = backbone_type[len('mmeffvit.'):] if backbone_type.startswith('mmeffvit.') \
        else backbone_type
    cls = MODELS.get(name)
    if cls is None:
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
    """The official ImageNet classification model of a variant (see CLASSIFIER_SPECS)."""
    cls = _registered_class(backbone_type)
    spec = CLASSIFIER_SPECS.get(cls.__name__)
    if spec is None:
        raise KeyError(f'no classification head is defined for {cls.__name__}; known: '
                       f'{sorted(CLASSIFIER_SPECS)} (add an entry to CLASSIFIER_SPECS)')
    args = dict(copy.deepcopy(spec['backbone']), **kwargs)
    if arch is not None:
        args['arch'] = arch
    return ImageNetClassifier(cls(**args), num_classes, spec.get('unused_norm', False),
                              spec.get('head', 'linear'))


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


def build_for_inference(cfg, shape=None):
    """``cfg.model`` built in the config's scope (seeded) for inference: the auxiliary head of
    a segmentor removed (it does not run at inference), SyncBN reverted, eval mode; and one
    random image of ``shape`` through its data preprocessor (which may pad it).

    Returns:
        tuple: ``(model, data, scope, shape)``; ``data`` holds ``inputs`` and ``data_samples``.
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
    return model, data, scope, shape


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
    model, data, scope, shape = build_for_inference(cfg, shape)
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
