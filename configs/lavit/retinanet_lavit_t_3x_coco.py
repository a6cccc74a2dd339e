# RetinaNet + FPN with a LaViT-T backbone, COCO, 3x schedule with multi-scale training
# (LaViT paper Table 3: 48.4 AP). Data, multi-scale pipeline (shorter side 640-800, longer side at
# most 1333) and schedule come from mmdet's common/ms_3x_coco.py (the training set repeated 3x
# over 12 runner epochs = 36 epochs, steps after epochs 27 and 33, 500 warm-up iterations); the
# optimiser is the 1x recipe's AdamW lr 1e-4, weight decay 1e-4, batch 16.
_base_ = [
    'mmdet::common/ms_3x_coco.py',
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    '../_base_/backbones/lavit_t.py',
]

model = dict(
    type='AuxLossSingleStageDetector',
    with_backbone_aux_loss=True,
    backbone=_base_.pop('backbone'),
    neck=dict(in_channels=[64, 128, 320, 448]))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001))
