# Mask R-CNN + FPN with a FLatten-PVT-T backbone, COCO instance segmentation, 3x schedule with
# multi-scale training: the PVT protocol (shorter side drawn from [640, 800], longer side at most
# 1333; 36 epochs). Data, multi-scale pipeline and schedule come from mmdet's
# common/ms-poly_3x_coco-instance.py (Detectron2's 3x recipe: the training set repeated 3 times
# over 12 runner epochs = 36 epochs, lr steps after epochs 27 and 33, 500 warm-up iterations);
# the optimiser is PVT's AdamW lr 1e-4, weight decay 1e-4, 8 GPUs x 2 images.
_base_ = [
    'mmdet::common/ms-poly_3x_coco-instance.py',
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/backbones/flatten_pvt_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001))
