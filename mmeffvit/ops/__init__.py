"""mmcv-style compiled operators for linear attention, with pure-PyTorch references.

``mmeffvit._ext`` (``csrc/``: ``common/cuda`` kernels, ``pytorch/cpu`` and ``pytorch/cuda``
implementations, device-independent entry points and one ``pybind.cpp``) is loaded lazily; when
it is not built every op falls back to its reference with a one-time info log.
Which path runs is the policy's choice (:mod:`mmeffvit.ops.policy`: ``MMEFFVIT_OPS=0/1``, and
:func:`use_reference` / :func:`use_kernels` for a block).

Ops: :func:`attention` (softmax attention: oneDNN row blocks, SDPA or explicit scores, the
policy's and the inputs' choice), :func:`scored_attention` (the same, keeping the scores) and
:func:`softmax_values` (given scores); :func:`focus_feature_map` (FLatten's focusing
function), :func:`linear_attention` (kv-first attention on mapped features: FLatten's mean
normaliser or L²ViT's clamped sum with temperature) and :func:`focused_linear_attention`
(both in one operator on the token layout; on CPU one pass over cache-sized token blocks, on
CUDA the two CUDA operators composed), :func:`focused_qkv_attention` (the same on a fused ``qkv``
projection with its depthwise-conv term, CPU paths of its own in training and inference);
:func:`depthwise_conv` (a stride-1 depthwise conv on channels-last token maps, GELU
optionally after it; the kernel chosen inside), :func:`depthwise_conv_weight_grad` (its weight
gradient on the CPU); :func:`depthwise_conv3x3_gelu` (PVT v2's 3×3 depthwise conv and
GELU in one pass, CPU inference); :func:`window_attention` (softmax attention in small windows with
a relative bias, trained or not; the compiled pass in CPU inference) and
:func:`gathered_window_attention` (the same with each window's keys read from a shared bank
through an index: Focal attention); :func:`linear` (the CPU
linears on oneDNN's or ATen's GEMM with the bias fused, the policy's choice), :func:`gelu_linear`
and :func:`mlp` (a transformer MLP that stores its pre-activation only in training),
:func:`mlp_residual` (a block's pre-norm MLP half, in place by row blocks in CPU inference),
:func:`layer_norm` (``F.layer_norm``, optionally in fp32 under autocast),
:func:`split_heads` (a fused projection's per-head views, whose backward may write over it),
:func:`query_grid_conv` (LaViT's attention-residual conv over a score map's query grid),
:func:`stripe_attention` (one branch of CSWin's cross-shaped window attention with its LePE).
"""
from .attention import attention, masked_softmax, scored_attention, softmax_values
from .depthwise_conv import (depthwise_conv, depthwise_conv3x3_gelu, depthwise_conv3x3_gelu_ref,
                             depthwise_conv_weight_grad, depthwise_conv_weight_grad_ref)
from .ext_loader import get_ext, load_ext, ops_mode
from .focus import focus_feature_map, focus_feature_map_ref
from .focused_linear_attention import focused_linear_attention, focused_linear_attention_ref
from .focused_qkv_attention import focused_qkv_attention
from .linear import gelu_linear, linear, mlp, mlp_residual, split_heads
from .norm import layer_norm
from .linear_attention import linear_attention, linear_attention_ref
from .policy import KernelPolicy, use_kernels, use_reference
from .query_grid_conv import query_grid_conv, query_grid_conv_reference
from .stripe_attention import stripe_attention
from .window_attention import (gathered_window_attention, gathered_window_attention_ref,
                               window_attention, window_attention_ref)

__all__ = [
    'attention', 'masked_softmax', 'scored_attention', 'softmax_values',
    'depthwise_conv', 'depthwise_conv3x3_gelu', 'depthwise_conv3x3_gelu_ref',
    'depthwise_conv_weight_grad', 'depthwise_conv_weight_grad_ref',
    'focus_feature_map', 'focus_feature_map_ref', 'focused_linear_attention',
    'focused_linear_attention_ref', 'focused_qkv_attention', 'linear_attention',
    'linear_attention_ref',
    'gelu_linear', 'get_ext', 'layer_norm', 'linear', 'load_ext', 'mlp', 'mlp_residual',
    'ops_mode', 'split_heads',
    'window_attention',
    'window_attention_ref',
    'gathered_window_attention', 'gathered_window_attention_ref', 'KernelPolicy', 'use_kernels',
    'use_reference', 'query_grid_conv', 'query_grid_conv_reference', 'stripe_attention'
]
