from .focused_linear_attention import (FocusedLinearAttention, focus_feature_map,
                                       kv_first_linear_attention)
from .spatial_reduction_attention import SpatialReductionAttention

__all__ = [
    'FocusedLinearAttention', 'focus_feature_map', 'kv_first_linear_attention',
    'SpatialReductionAttention'
]
