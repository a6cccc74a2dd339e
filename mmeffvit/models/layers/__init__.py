from .attention_residual import AttentionResidualDownsample
from .clamped_linear_attention import clamped_linear_attention
from .depthwise_conv import DepthwiseConv2d
from .focused_linear_attention import FocusedLinearAttention
from .less_attention import LessAttention, VanillaAttention
from .linear import Linear, Mlp
from .norm import LayerNormFP32
from .patch_embed import PatchEmbed
from .pvt_block import FLattenPVTBlock
from .relative_position import WindowMSA
from .spatial_reduction_attention import SpatialReductionAttention, SpatialReductionMixin
from .window import pad_to_multiple, pad_to_windows, window_partition, window_reverse

__all__ = [
    'AttentionResidualDownsample', 'FLattenPVTBlock', 'FocusedLinearAttention', 'LayerNormFP32',
    'LessAttention', 'PatchEmbed', 'SpatialReductionAttention', 'SpatialReductionMixin',
    'VanillaAttention', 'WindowMSA', 'clamped_linear_attention', 'pad_to_multiple',
    'pad_to_windows', 'window_partition', 'window_reverse'
]
__all__ += ['DepthwiseConv2d', 'Linear', 'Mlp']
