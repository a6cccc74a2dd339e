"""Diagonality-preserving loss of LaViT (Zhang et al., CVPR 2024, sec. 3.4, Eq. 8-9)."""
import torch
import torch.nn as nn

from ...registry import register_model

_INPUTS = ('logits', 'probs', 'raw')
_SIGNS = ('corrected', 'literal')
_NORMS = ('N', 'N2', 'none')


def diagonality_loss(attn, input_type='logits', sign='corrected', normalize='N'):
    """L_DP of square attention maps ``(..., N, N)``, averaged over the leading dims.

    ``L = Σ_ij |P_ij − P_ji| + s · Σ_i (Σ_{j≠i} P_ij − (N−1) P_ii)`` with ``s = +1``
    (``'corrected'``: minimising it raises each diagonal entry above the rest of its row) or
    ``s = −1`` (``'literal'``: the printed ``(N−1)A_ii − Σ_{j≠i}A_ij``, which pushes the diagonal
    *down*). ``P`` is ``softmax(attn)`` over rows (``'logits'``), ``attn`` itself (``'probs'``,
    already row-stochastic) or the raw scores (``'raw'``: the printed form, unbounded below).
    ``normalize`` divides each map's value by ``N`` (default), ``N²`` or nothing: for
    row-stochastic ``P`` the symmetry term lies in ``[0, 2N]`` and the diagonal term, which
    equals ``Σ_i (1 − N·P_ii)``, in ``[N − N², N]``; divided by ``N`` they stay in ``[0, 2]`` and
    ``[1 − N, 1]``.

    Args:
        attn (Tensor): ``(..., N, N)`` maps.
        input_type (str): ``'logits'`` | ``'probs'`` | ``'raw'``.
        sign (str): ``'corrected'`` | ``'literal'``.
        normalize (str): ``'N'`` | ``'N2'`` | ``'none'``.

    Returns:
        Tensor: scalar (float32 or wider).
    """
    if attn.dim() < 2 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f'diagonality loss needs square (..., N, N) maps, got {tuple(attn.shape)}')
    for name, value, allowed in (('input_type', input_type, _INPUTS), ('sign', sign, _SIGNS),
                                 ('normalize', normalize, _NORMS)):
        if value not in allowed:
            raise ValueError(f'{name} must be one of {allowed}, got {value!r}')
    p = attn.to(torch.promote_types(attn.dtype, torch.float32))
    if input_type == 'logits':
        p = p.softmax(dim=-1)
    n = p.shape[-1]
    symmetry = (p - p.transpose(-2, -1)).abs().sum(dim=(-2, -1))
    diag = p.diagonal(dim1=-2, dim2=-1)
    off_diag_mass = p.sum(dim=-1) - diag
    dominance = (off_diag_mass - (n - 1) * diag).sum(dim=-1)
    if sign == 'literal':
        dominance = -dominance
    per_map = symmetry + dominance
    scale = {'N': n, 'N2': n * n, 'none': 1}[normalize]
    return (per_map / scale).mean()


@register_model
class DiagonalityLoss(nn.Module):
    """Diagonality-preserving loss L_DP (LaViT sec. 3.4), registered in ``MODELS``.

    The paper adds ``Σ_l L_DP,l`` over all transformed (less-attention) layers to the
    cross-entropy. The printed formula has two problems, handled as follows (defaults in
    brackets, the literal form stays available):

    * sign [``'corrected'``]: as printed, minimising ``(N−1)A_ii − Σ_{j≠i}A_ij`` lowers the
      diagonal, the opposite of the stated aim; ``sign='literal'`` keeps it.
    * input [``'logits'`` → softmax]: on raw scores both terms are unbounded below (reported to
      run away in reproductions); on row-stochastic maps they are bounded and, for the
      diagonal term, ``Σ_i (1 − N·P_ii)``. ``input_type='raw'`` keeps the literal reading.
    * scale [``'N'``]: the per-map value is divided by ``N`` (``'N2'``, ``'none'``).

    Maps are averaged over batch, heads and layers; ``loss_weight`` is λ.

    Args:
        loss_weight (float): λ.
        input_type (str): ``'logits'`` | ``'probs'`` | ``'raw'``.
        sign (str): ``'corrected'`` | ``'literal'``.
        normalize (str): ``'N'`` | ``'N2'`` | ``'none'``.
        loss_name (str): Key of the loss in a loss dict (``'loss_diag'``).

    Example:
        >>> import torch
        >>> loss = DiagonalityLoss(loss_weight=1.0, input_type='probs')
        >>> float(loss(torch.eye(3)))
        -2.0
    """

    def __init__(self, loss_weight=1.0, input_type='logits', sign='corrected', normalize='N',
                 loss_name='loss_diag'):
        super().__init__()
        diagonality_loss(torch.zeros(1, 1), input_type, sign, normalize)  # validate choices
        if loss_weight < 0:
            raise ValueError(f'loss_weight must be >= 0, got {loss_weight}')
        self.loss_weight = float(loss_weight)
        self.input_type, self.sign, self.normalize = input_type, sign, normalize
        self.loss_name = loss_name

    def forward(self, attn):
        """Args: attn (Tensor | Sequence[Tensor]): square maps ``(..., N, N)``; a list is
        averaged over its entries (layers may differ in N). Returns a scalar."""
        maps = [attn] if torch.is_tensor(attn) else list(attn)
        if not maps:
            raise ValueError('DiagonalityLoss got no attention maps')
        values = [diagonality_loss(m, self.input_type, self.sign, self.normalize) for m in maps]
        return self.loss_weight * torch.stack(values).mean()
