"""The rows of the model zoo: every variant mmeffvit builds, from the backbones' ``arch_settings``
plus variants that are an arch with other constructor arguments (Swin-B at 384², Focal's conv
embedding), and which of them have official ImageNet weights.

A :class:`Variant` knows its classifier (``mmeffvit.analysis.models.CLASSIFIER_SPECS``) and
dense-backbone arguments, and whether a config's ``model.backbone`` dict builds it.
"""
import inspect
from functools import lru_cache

from ..models import CLASSIFIER_SPECS

#: registered backbone type -> name of its rows and section
FAMILIES = {'FLattenPVT': 'FLatten-PVT', 'FLattenPVTv2': 'FLatten-PVTv2',
            'FLattenSwin': 'FLatten-Swin', 'FLattenCSWin': 'FLatten-CSWin',
            'FLattenDeiT': 'FLatten-DeiT', 'LaViT': 'LaViT', 'CARE': 'CARE', 'L2ViT': 'L2ViT',
            'FocalTransformer': 'Focal'}
#: variants that are an arch with other constructor arguments (name suffix, arch, kwargs)
EXTRA_VARIANTS = {
    'FLattenSwin': [('B@384', 'base', dict(pretrain_img_size=384, window_size=12))],
    'FocalTransformer': [(f'{s}-conv', arch, dict(use_conv_embed=True))
                         for s, arch in (('T', 'tiny'), ('S', 'small'), ('B', 'base'))],
}
#: ImageNet checkpoints the official repositories released (a fact about the releases, not
#: computable from the code; reference notes flatten.md sec. 3, care.md sec. 7, l2vit.md sec. 3,
#: focal.md sec. 6): variant name -> remark ('' = downloadable)
RELEASED = {
    **{name: '' for name in ('FLatten-PVT-T', 'FLatten-PVTv2-B0', 'FLatten-Swin-T',
                             'FLatten-Swin-S', 'FLatten-Swin-B', 'FLatten-Swin-B@384',
                             'FLatten-CSWin-T', 'CARE-S0', 'CARE-S1', 'CARE-S2', 'L2ViT-T',
                             'L2ViT-S', 'L2ViT-B')},
    **{f'Focal-{s}{c}': 'released, official links dead (issues #8, #20, #24, #27)'
       for s in 'TSB' for c in ('', '-conv')},
}
_SHORT = {'tiny': 'T', 'small': 'S', 'medium': 'M', 'large': 'L', 'base': 'B', 'base_384': 'B@384'}


class Variant:
    """One row: a backbone type, an arch and extra constructor arguments."""

    def __init__(self, type_name, arch, kwargs=None, short=None):
        self.type = type_name
        self.arch = arch
        self.kwargs = dict(kwargs or {})
        self.short = short or _SHORT.get(arch, arch.upper())

    @property
    def name(self):
        return f'{FAMILIES[self.type]}-{self.short}'

    def classifier_args(self):
        """Constructor arguments of the classifier (``build_classifier``)."""
        return dict(arch=self.arch, **self.kwargs)

    def backbone_args(self):
        """Constructor arguments of the dense backbone (the zoo's dense defaults included)."""
        spec = CLASSIFIER_SPECS.get(self.type, {}).get('dense', {})
        return dict(spec, arch=self.arch, **self.kwargs)

    def cls_resolution(self):
        """The ImageNet resolution: the backbone's pre-training size."""
        return _pair(self.kwargs.get('pretrain_img_size') or self._arch_size(self.arch))

    def _arch_size(self, arch):
        setting = self.backbone_class().arch_settings.get(arch, {})
        return setting.get('pretrain_img_size', 224) if isinstance(setting, dict) else 224

    def backbone_class(self):
        return _registered(self.type)

    def _defining_keys(self):
        """Arguments that tell this type's variants apart beyond arch and resolution."""
        return {k for _, _, kw in EXTRA_VARIANTS.get(self.type, []) for k in kw} - {
            'pretrain_img_size'}

    def matches(self, backbone_cfg):
        """Whether a config's ``model.backbone`` dict builds this variant."""
        type_name = str(backbone_cfg.get('type', '')).split('.')[-1]
        arch = backbone_cfg.get('arch')
        if type_name != self.type or not isinstance(arch, str):
            return False
        cls = self.backbone_class()
        arch = getattr(cls, 'arch_aliases', {}).get(arch.lower(), arch.lower())
        size = _pair(backbone_cfg.get('pretrain_img_size') or self._arch_size(arch))
        if arch != self.arch or size != self.cls_resolution():
            return False
        defaults = inspect.signature(cls.__init__).parameters
        for key in self._defining_keys():
            default = defaults[key].default if key in defaults else None
            if backbone_cfg.get(key, default) != self.kwargs.get(key, default):
                return False
        return True


@lru_cache(maxsize=None)
def _registered(type_name):
    """The registered class of a backbone type (mmengine's registry lookup logs; done once)."""
    from ...registry import MODELS
    return MODELS.get(type_name)


def _pair(size):
    return (size, size) if isinstance(size, int) else tuple(size)


def variants():
    """Every row of the table, in family order, from the backbones' ``arch_settings``."""
    from ...registry import MODELS
    rows = []
    for type_name in FAMILIES:
        for arch in MODELS.get(type_name).arch_settings:
            rows.append(Variant(type_name, arch))
        for short, arch, kwargs in EXTRA_VARIANTS.get(type_name, []):
            rows.append(Variant(type_name, arch, kwargs, short))
    return rows
