"""DiagonalityLoss: hand-computed 3x3 values, options, bad inputs, gradient to Θ/Ψ."""
import math

import pytest
import torch

from mmeffvit.models import DiagonalityLoss, LessAttention, diagonality_loss

# a row-stochastic 3x3 map and its terms, computed by hand:
#   symmetry  = 2 * (|.3-.1| + |.2-.2| + |.1-.2|)            = 0.6
#   dominance = (.5 - 2*.5) + (.2 - 2*.8) + (.4 - 2*.6)       = -0.5 - 1.4 - 0.8 = -2.7
P = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]], dtype=torch.float64)


def test_hand_computed_3x3_corrected_sign():
    loss = DiagonalityLoss(loss_weight=1.0, input_type='probs')
    assert float(loss(P)) == pytest.approx((0.6 - 2.7) / 3, abs=1e-12)


def test_hand_computed_3x3_literal_and_scales():
    assert float(diagonality_loss(P, 'probs', 'literal', 'N')) == pytest.approx((0.6 + 2.7) / 3)
    assert float(diagonality_loss(P, 'probs', 'corrected', 'none')) == pytest.approx(-2.1)
    assert float(diagonality_loss(P, 'probs', 'corrected', 'N2')) == pytest.approx(-2.1 / 9)


def test_logits_are_softmaxed_first_and_weight_applies():
    loss = DiagonalityLoss(loss_weight=0.5)  # input_type='logits'
    assert float(loss(P.log() + 3.0)) == pytest.approx(0.5 * (0.6 - 2.7) / 3, abs=1e-9)


def test_raw_reading_uses_scores_as_printed():
    a = torch.tensor([[1., 2.], [0., 3.]])
    # symmetry 2*|2-0| = 4; dominance (2 - 1*1) + (0 - 1*3) = -2; literal flips it to +2
    assert float(diagonality_loss(a, 'raw', 'corrected', 'none')) == pytest.approx(2.0)
    assert float(diagonality_loss(a, 'raw', 'literal', 'none')) == pytest.approx(6.0)


def test_minimum_is_the_identity_and_batch_heads_layers_average():
    n = 5
    eye = torch.eye(n).expand(2, 3, n, n)
    uniform = torch.full((2, 3, n, n), 1.0 / n)
    loss = DiagonalityLoss(input_type='probs')
    assert float(loss(eye)) == pytest.approx((0 + n * (1 - n)) / n)
    assert float(loss(uniform)) == pytest.approx(0.0, abs=1e-6)
    assert float(loss([eye, uniform])) == pytest.approx((1 - n) / 2)
    # the corrected sign prefers a sharper diagonal
    assert float(loss(eye)) < float(loss(uniform))


def test_bad_inputs():
    with pytest.raises(ValueError, match='square'):
        diagonality_loss(torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match='sign'):
        DiagonalityLoss(sign='minus')
    with pytest.raises(ValueError, match='input_type'):
        DiagonalityLoss(input_type='softmax')
    with pytest.raises(ValueError, match='loss_weight'):
        DiagonalityLoss(loss_weight=-1)
    with pytest.raises(ValueError, match='no attention maps'):
        DiagonalityLoss()([])


def test_gradient_reaches_theta_and_psi():
    torch.manual_seed(0)
    la = LessAttention(8, 2, num_queries=4, num_keys=4, identity_init=False)
    prev = torch.randn(3, 2, 4, 4)
    _, scores, probs, _ = la(torch.randn(3, 4, 8), (2, 2), prev)
    DiagonalityLoss(input_type='probs')(probs).backward()
    for lin in (la.theta, la.psi):
        assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0
    assert la.theta.bias.grad.abs().sum() > 0


def test_registered_and_bf16_finite():
    from mmeffvit.registry import MODELS
    loss = MODELS.build(dict(type='DiagonalityLoss', loss_weight=0.1))
    x = torch.randn(2, 4, 6, 6, dtype=torch.bfloat16, requires_grad=True)
    value = loss(x)
    value.backward()
    assert value.dtype == torch.float32 and math.isfinite(float(value))
    assert torch.isfinite(x.grad.float()).all()
