from .checkpoint import (allow_mmengine_checkpoints, load_checkpoint_file,
                         unwrap_state_dict)
from .suggest import closest_first, install_registry_hints, unknown_choice_error
from .tensor import (TokenGridResizeCache, at_least_fp32, map_to_tokens, resize_token_grid,
                     split_heads, square_side, tokens_to_contiguous_map,
                     tokens_to_map)
from .sample_photos import SAMPLE_PHOTOS, sample_photo

__all__ = [
    'allow_mmengine_checkpoints', 'at_least_fp32', 'load_checkpoint_file', 'map_to_tokens',
    'resize_token_grid', 'split_heads', 'square_side', 'tokens_to_contiguous_map',
    'tokens_to_map', 'unwrap_state_dict',
    'closest_first', 'install_registry_hints', 'unknown_choice_error'
]
__all__ += ['SAMPLE_PHOTOS', 'sample_photo', 'TokenGridResizeCache']
