# Mask R-CNN + FPN with a Focal-T backbone, COCO, 3x schedule with Swin's multi-scale + random-crop
# training (official README: 47.2 box AP, 42.7 mask AP). Recipe in
# _base_/swin_coco_instance_ms_crop_3x.py (as the 1x recipe, 36 epochs, steps at 27 and 33); the
# backbone as in mask_rcnn_focal_t_1x_coco.py.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/swin_coco_instance_ms_crop_3x.py',
    '../_base_/backbones/focal_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[96, 192, 384, 768]))
