"""Mixed precision on CPU: a backbone under autocast against its own fp32 forward/backward.

Tolerances are set from the unit roundoff ``u`` of the autocast dtype (bf16: 8 significant
bits, ``u = 2⁻⁸ ≈ 3.9e-3``; fp16: 11 bits, ``u = 2⁻¹¹ ≈ 4.9e-4``).

- Outputs: every matmul/conv input is rounded once per layer, so a stage map carries a few
  ``u`` of relative error (measured on the small CARE / L²ViT / Focal configs at 97×131 over
  three seeds and two initialisations: 0.6-3.3 ``u``), hence ``10 u``. The mean of an output
  averages thousands of independent rounding errors, so its relative error must stay below
  ``u`` itself (measured: at most 0.03 ``u``); a systematic bias (truncation instead of
  rounding, a branch lost in low precision) would exceed it.
- Gradients (all parameters together): a ReLU (L²ViT's stem) passes or stops the gradient by
  the sign of its input, and inputs within rounding distance of zero flip; the flipped fraction
  grows like ``u``, the gradient error like ``√u`` (measured on L²ViT: 0.30 ``√u`` in bf16,
  0.37 ``√u`` in fp16, nearly all of it in the stem conv behind the ReLU; CARE and Focal, without
  a ReLU: 1.4-2.3 ``u``). The bound is ``√u`` (6 % in bf16, 2.2 % in fp16).

Failures these bounds catch are far larger: an fp16 overflow (inf), a gradient that underflows
(100 %), or a sum over tokens accumulated in bf16 (torch's CPU LayerNorm weight/bias gradients:
2.7 % at 825 tokens, 66 % at 10⁴; see ``LayerNormFP32``, which is also tested directly).

fp16 backward passes are scaled by ``LOSS_SCALE`` as ``torch.amp.GradScaler`` does (its initial
scale is 2¹⁶ and it backs off on overflow; 2¹⁰ suffices here and does not overflow). Unscaled,
the per-logit terms of the attention-bias gradients fall below fp16's smallest numbers and
flush to zero (Focal-T at 97×131: stage-1 bias tables 44-50 % off).
"""
import pytest
import torch

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
OUTPUT_TOL = 10  # × u
LOSS_SCALE = {torch.bfloat16: 1.0, torch.float16: 2.0**10}


def cpu_autocast_supports(dtype):
    """Whether ``torch.autocast('cpu', dtype=dtype)`` really runs in ``dtype`` in this torch
    (unsupported dtypes are disabled with a warning, not refused)."""
    if not torch.amp.autocast_mode.is_autocast_available('cpu'):
        return False
    try:
        with torch.autocast('cpu', dtype=dtype):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == dtype
    except (RuntimeError, ValueError):
        return False


#: parametrisation of the CPU autocast tests: fp16 is skipped where CPU autocast lacks it
AMP_DTYPES = [
    pytest.param(dtype, id=str(dtype).split('.')[-1],
                 marks=pytest.mark.skipif(not cpu_autocast_supports(dtype),
                                          reason=f'CPU autocast does not support {dtype}'))
    for dtype in (torch.bfloat16, torch.float16)
]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check_autocast_against_fp32(model, x, dtype):
    """Train-mode forward and backward of ``model`` on ``x`` in fp32, then under CPU autocast
    with ``dtype``; the loss weights every output element (fixed random weights), so every
    parameter gets a generic gradient. Asserts that every trainable parameter gets a finite
    gradient, finite outputs and the bounds above; returns ``(output errors, gradient
    error)`` in units of ``u``."""
    model.train()
    u = UNIT_ROUNDOFF[dtype]
    gen = torch.Generator().manual_seed(0)

    def run(autocast):
        model.zero_grad(set_to_none=True)
        with torch.autocast('cpu', dtype=dtype, enabled=autocast):
            outs = model(x)
        loss = sum((o.float() * w).mean() for o, w in zip(outs, weights))
        scale = LOSS_SCALE[dtype] if autocast else 1.0
        (loss * scale).backward()
        grads = {n: p.grad / scale for n, p in model.named_parameters() if p.grad is not None}
        return [o.detach() for o in outs], grads

    with torch.no_grad():
        shapes = [o.shape for o in model(x)]
    weights = [torch.randn(s, generator=gen) for s in shapes]
    ref_outs, ref_grads = run(False)
    outs, grads = run(True)

    assert all(o.dtype in (dtype, torch.float32) for o in outs)
    for i, (o, r) in enumerate(zip(outs, ref_outs)):
        assert torch.isfinite(o).all(), f'output {i} is not finite'
        err = rel(o, r)
        assert err < OUTPUT_TOL * u, f'output {i}: relative error {err:.2e}'
        mean_err = (o.double().mean() - r.double().mean()).abs() / r.double().abs().mean()
        assert mean_err < u, f'output {i}: relative error of the mean {mean_err:.2e}'
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert ref_grads.keys() == grads.keys() == trainable, 'a parameter gets no gradient'
    for name, g in grads.items():
        assert torch.isfinite(g).all(), f'gradient of {name} is not finite'
    flat = torch.cat([grads[n].flatten() for n in ref_grads])
    flat_ref = torch.cat([g.flatten() for g in ref_grads.values()])
    grad_err = rel(flat, flat_ref)
    assert grad_err < u**0.5, f'gradients: relative error {grad_err:.2e}'
    return [rel(o, r) / u for o, r in zip(outs, ref_outs)], grad_err / u
