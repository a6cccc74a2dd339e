# The LaViT-T backbone as the LaViT detection configs use it: less attention in windows of its
# 224x224 training grid (la_mode='window': any input size, cost linear in the image area), the
# diagonality-preserving loss of sec. 3.4 on the less-attention maps (weight 0.01, logged as
# `loss_diag` by the AuxLoss* detectors and segmentors; turn it off with
# model.with_backbone_aux_loss=False or model.backbone.diag_loss=None), drop path 0.1, the four
# stage outputs for the neck. A config takes it with `model = dict(backbone=_base_.pop('backbone'),
# ...)`, which also drops this helper key (configs/README.md); `_delete_` replaces the ResNet.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# LaViT has no public weights: ImageNet-1k weights of your own LaViT-T (224x224); fill in the path
pretrained = 'checkpoints/lavit_t.pth'
backbone = dict(
    _delete_=True,
    type='LaViT',
    arch='tiny',
    la_mode='window',
    diag_loss=dict(type='DiagonalityLoss', loss_weight=0.01),
    drop_path_rate=0.1,
    out_indices=(0, 1, 2, 3),
    init_cfg=dict(type='Pretrained', checkpoint=pretrained))
