"""LayerNorm that stays in fp32 under autocast on every device."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...utils import at_least_fp32


class LayerNormFP32(nn.LayerNorm):
    """:class:`torch.nn.LayerNorm` computed in (at least) fp32 whenever autocast is enabled.

    CUDA autocast already runs ``layer_norm`` in fp32; CPU autocast does not, and torch's CPU
    kernel then accumulates the ``weight``/``bias`` gradients (sums over all tokens) in the
    reduced dtype: under bf16 their relative error grows with the token count (about 3 % at
    825 tokens, 66 % at 10⁴, measured with torch 2.14), and the residual stream that feeds the
    norm is rounded to bf16 after every block. Here the input is upcast, the output is fp32
    (the residual stream stays fp32, as under CUDA autocast) and the following projections are
    cast down by autocast as usual. Without autocast this is exactly ``nn.LayerNorm``; the
    parameter names and the class hierarchy (init rules, optimizer norm-decay rules) are the same.
    """

    def forward(self, x):
        if not torch.is_autocast_enabled(x.device.type):
            return super().forward(x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = at_least_fp32(x)
            weight = None if self.weight is None else self.weight.to(x.dtype)
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)
