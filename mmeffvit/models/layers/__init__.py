from .clamped_linear_attention import clamped_linear_attention
from .focused_linear_attention import (FocusedLinearAttention, focus_feature_map,
                                       kv_first_linear_attention)
from .attention_residual import AttentionResidualDownsample
from .less_attention import LessAttention, VanillaAttention
from .norm import LayerNormFP32
from .spatial_reduction_attention import SpatialReductionAttention
from .window import pad_to_multiple, pad_to_windows, window_partition, window_reverse

__all__ = [
    'FocusedLinearAttention', 'focus_feature_map', 'kv_first_linear_attention',
    'SpatialReductionAttention', 'clamped_linear_attention', 'AttentionResidualDownsample',
    'LessAttention', 'VanillaAttention',
    'LayerNormFP32', 'pad_to_multiple', 'pad_to_windows', 'window_partition', 'window_reverse'
]
