"""Datasets that need no download.

The exports are resolved lazily (PEP 562) so that importing this package stays cheap and
``python -m mmeffvit.datasets.shapes`` does not import the module twice.
"""
_EXPORTS = {
    'generate_shapes': 'shapes', 'SHAPES_CLASSES': 'shapes', 'SHAPES_SEG_CLASSES': 'shapes',
    'SHAPES_SEG_PALETTE': 'shapes', 'SHAPES_DET_PALETTE': 'shapes',
    'generate_shapes_cls': 'shapes_cls', 'SHAPES_CLS_CLASSES': 'shapes_cls'
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f'.{_EXPORTS[name]}', __name__), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
    return sorted(list(globals()) + __all__)
