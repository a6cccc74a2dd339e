from .diagonality_loss import DiagonalityLoss, diagonality_loss

__all__ = ['DiagonalityLoss', 'diagonality_loss']
