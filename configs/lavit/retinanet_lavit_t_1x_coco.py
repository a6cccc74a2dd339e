# RetinaNet + FPN with a LaViT-T backbone, COCO detection, 1x schedule (LaViT paper sec. 4.3,
# Table 3: 46.2 AP). The paper gives AdamW and batch 16 on 8 GPUs; the rest is mmdet's PVT
# RetinaNet recipe (pvt/retinanet_pvt-t_fpn_1x_coco.py): lr 1e-4, weight decay 1e-4, 12 epochs,
# steps at 8 and 11, single-scale 1333x800.
# The backbone runs less attention in windows of its 224x224 training grid (la_mode='window':
# any input size, cost linear in the image area). The diagonality-preserving loss (sec. 3.4) on
# the less-attention maps is logged as `loss_diag`; turn it off with
# model.with_backbone_aux_loss=False (or model.backbone.diag_loss=None).
_base_ = [
    'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py',
    '../_base_/backbones/lavit_t.py',
]

model = dict(
    type='AuxLossSingleStageDetector',  # RetinaNet + the backbone's auxiliary losses
    with_backbone_aux_loss=True,
    backbone=_base_.pop('backbone'),
    neck=dict(in_channels=[64, 128, 320, 448]))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001))
