"""Models that add their backbone's auxiliary losses to the loss dict.

mmdet's ``SingleStageDetector.loss``/``TwoStageDetector.loss``, mmseg's ``EncoderDecoder.loss``
and mmpretrain's ``ImageClassifier.loss`` only collect head losses. A backbone that computes its
own training losses (LaViT's diagonality-preserving loss, sec. 3.4) exposes them through
``aux_losses()`` after its forward; the thin subclasses here add them (``loss_diag``) so mmengine
sums and logs them like any other loss. They are registered only when their toolbox is installed.
"""
from ...registry import register_model


class BackboneAuxLossMixin:
    """Adds ``self.backbone.aux_losses()`` to the dict returned by ``loss()``.

    ``with_backbone_aux_loss=False`` (a config switch) drops them; a backbone without
    ``aux_losses`` contributes nothing. Must come before the toolbox class in the bases.
    """

    def __init__(self, *args, with_backbone_aux_loss=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.with_backbone_aux_loss = with_backbone_aux_loss

    def loss(self, *args, **kwargs):
        losses = super().loss(*args, **kwargs)
        getter = getattr(self.backbone, 'aux_losses', None)
        aux = getter() if callable(getter) else {}  # always read, so nothing stale survives
        if self.with_backbone_aux_loss:
            clash = set(aux) & set(losses)
            if clash:
                raise KeyError(f'backbone auxiliary losses {sorted(clash)} clash with head losses')
            losses.update(aux)
        return losses


_NAMES = []

try:
    from mmdet.models.detectors import SingleStageDetector, TwoStageDetector
except ImportError:  # mmdet not installed: nothing to register
    pass
else:
    @register_model
    class AuxLossSingleStageDetector(BackboneAuxLossMixin, SingleStageDetector):
        """mmdet ``SingleStageDetector`` (RetinaNet, FCOS, ...) + backbone auxiliary losses."""

    @register_model
    class AuxLossTwoStageDetector(BackboneAuxLossMixin, TwoStageDetector):
        """mmdet ``TwoStageDetector`` (Faster/Mask R-CNN, ...) + backbone auxiliary losses."""

    _NAMES += ['AuxLossSingleStageDetector', 'AuxLossTwoStageDetector']

try:
    from mmseg.models.segmentors import EncoderDecoder
except ImportError:  # mmseg not installed
    pass
else:
    @register_model
    class AuxLossEncoderDecoder(BackboneAuxLossMixin, EncoderDecoder):
        """mmseg ``EncoderDecoder`` + backbone auxiliary losses."""

    _NAMES += ['AuxLossEncoderDecoder']


try:
    from mmpretrain.models.classifiers import ImageClassifier
except ImportError:  # mmpretrain not installed
    pass
else:
    @register_model
    class AuxLossImageClassifier(BackboneAuxLossMixin, ImageClassifier):
        """mmpretrain ``ImageClassifier`` + backbone auxiliary losses (LaViT pre-training)."""

    _NAMES += ['AuxLossImageClassifier']


def aux_loss_model_names():
    """Names of the auxiliary-loss detectors/segmentors registered in this environment."""
    return list(_NAMES)
