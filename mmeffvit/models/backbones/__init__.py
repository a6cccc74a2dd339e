from .base import EffBackbone
from .flatten_cswin import FLattenCSWin
from .flatten_deit import FLattenDeiT
from .flatten_pvt import FLattenPVT
from .flatten_pvt_v2 import FLattenPVTv2
from .flatten_swin import FLattenSwin

__all__ = [
    'EffBackbone', 'FLattenDeiT', 'FLattenCSWin', 'FLattenPVT', 'FLattenPVTv2', 'FLattenSwin']
