"""Linear attention with a ReLU kernel, a per-head temperature and a clamped normaliser (L²ViT)."""
import torch

from ... import ops
from ...utils import at_least_fp32


def clamped_linear_attention(q, k, v, temperature, min_denominator=100.):
    """``o_i = τ·φ(q_i)ᵀ(Σ_j φ(k_j) v_jᵀ) / max(φ(q_i)ᵀ Σ_j φ(k_j), m)`` with ``φ = ReLU``.

    The global linear attention of L²ViT (Zheng, arXiv 2501.16182, sec. 3.2), in the "kv-first"
    order of the official ``forward``: the ``d×d`` state ``Σ_j φ(k_j) v_jᵀ`` is formed first, so
    the cost is linear in the number of tokens. Unlike FLatten's mean-normalised form the sums
    are **not** divided by the token count, and the normaliser is clamped from below (``m = 100``
    in every release): rows whose attention mass ``φ(q_i)·Σφ(k)`` is small are divided by ``m``
    instead of being normalised, so the regime depends on the resolution. This is kept
    exactly as released. All arithmetic runs in fp32 with autocast disabled, because the plain
    sums over ~10⁴-10⁵ detection tokens overflow fp16. The kernel is applied here; the attention
    itself runs :func:`mmeffvit.ops.linear_attention` (``normalizer='sum'``: the compiled
    operator when built, else its PyTorch reference).

    Args:
        q (Tensor): ``(B, h, N, d)`` queries, before the kernel.
        k (Tensor): ``(B, h, n, d)`` keys, before the kernel.
        v (Tensor): ``(B, h, n, d)`` values.
        temperature (Tensor): ``(h, 1, 1)`` learnable per-head scale ``τ`` of the state.
        min_denominator (float): The clamp ``m`` of the normaliser.

    Returns:
        Tensor: ``(B, h, N, d)`` in fp32 (fp64 for fp64 input).
    """
    with torch.autocast(device_type=q.device.type, enabled=False):
        q = torch.relu(at_least_fp32(q))
        k = torch.relu(at_least_fp32(k))
        v = at_least_fp32(v)
        return ops.linear_attention(q, k, v, normalizer='sum', temperature=temperature,
                                    clamp_min=min_denominator)
