from .base import EffBackbone
from .care import CARE
from .flatten_cswin import FLattenCSWin
from .flatten_deit import FLattenDeiT
from .flatten_pvt import FLattenPVT
from .flatten_pvt_v2 import FLattenPVTv2
from .flatten_swin import FLattenSwin
from .lavit import LaViT
from .focal_transformer import FocalTransformer
from .l2vit import L2ViT

__all__ = [
    'EffBackbone', 'FLattenDeiT', 'FLattenCSWin', 'FLattenPVT', 'FLattenPVTv2', 'FLattenSwin',
    'L2ViT', 'CARE', 'FocalTransformer', 'LaViT']
