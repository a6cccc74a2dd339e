"""Datasets that need no download.

The exports are resolved lazily (PEP 562) so that importing this package stays cheap and
``python -m mmeffvit.datasets.shapes`` does not import the module twice.
"""
__all__ = [
    'generate_shapes', 'SHAPES_CLASSES', 'SHAPES_SEG_CLASSES', 'SHAPES_SEG_PALETTE',
    'SHAPES_DET_PALETTE'
]


def __getattr__(name):
    if name in __all__:
        from . import shapes
        return getattr(shapes, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
    return sorted(list(globals()) + __all__)
