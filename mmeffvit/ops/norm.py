"""Layer normalisation with the precision rule of the blocks' norms (``LayerNormFP32``)."""
import torch
import torch.nn.functional as F

from ..utils.tensor import at_least_fp32


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, fp32=False):
    """``F.layer_norm(x, normalized_shape, weight, bias, eps)``; with ``fp32``, under autocast
    computed in (at least) fp32 with autocast off and returned in that dtype (CPU autocast
    would run it in bf16 and accumulate the affine gradients over all tokens in bf16).
    Without autocast exactly ``F.layer_norm``."""
    if not (fp32 and torch.is_autocast_enabled(x.device.type)):
        return F.layer_norm(x, normalized_shape, weight, bias, eps)
    with torch.autocast(device_type=x.device.type, enabled=False):
        x = at_least_fp32(x)
        weight = None if weight is None else weight.to(x.dtype)
        bias = None if bias is None else bias.to(x.dtype)
        return F.layer_norm(x, normalized_shape, weight, bias, eps)
