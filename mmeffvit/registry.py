"""Registries of mmeffvit.

mmeffvit components are registered twice, on purpose:

* in mmeffvit's own child registry (scope ``mmeffvit``), so ``type='mmeffvit.FLattenPVT'`` resolves
  from any OpenMMLab scope (mmengine looks up ``<scope>.<Name>`` among the root's children);
* in mmengine's root registry, so the plain ``type='FLattenPVT'`` resolves from mmdet, mmseg and
  mmpretrain configs: their registries search their own table, then their ancestors, never their
  siblings.

Names are distinctive (``FLatten*``, ``LaViT``, ...) so the root registration cannot shadow a
toolbox's own component.
"""
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmeffvit', locations=['mmeffvit.models'])


def register_model(cls=None, *, name=None):
    """Register a model component in mmeffvit's registry and in mmengine's root registry.

    Usable as ``@register_model`` or ``@register_model(name='Other')``.
    """

    def _register(module):
        MODELS.register_module(name=name, module=module)
        MMENGINE_MODELS.register_module(name=name, module=module)
        return module

    return _register if cls is None else _register(cls)


def mmeffvit_model_names():
    """Names of every model component mmeffvit registers (sorted)."""
    MODELS.import_from_location()
    return sorted(MODELS.module_dict)
