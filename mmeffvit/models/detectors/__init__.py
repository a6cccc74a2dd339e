from .aux_loss import BackboneAuxLossMixin, aux_loss_model_names

__all__ = ['BackboneAuxLossMixin', 'aux_loss_model_names']
