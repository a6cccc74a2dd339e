from .base import EffBackbone
from .flatten_pvt import FLattenPVT

__all__ = ['EffBackbone', 'FLattenPVT']
