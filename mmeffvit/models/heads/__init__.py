from . import care_head
from .care_head import CAREHead, CAREHeadMixin

__all__ = ['CAREHead', 'CAREHeadMixin']
if getattr(care_head, 'ClsHead', None) is not None:  # registered when mmpretrain is installed
    from .care_head import CAREClsHead  # noqa: F401
    __all__.append('CAREClsHead')
