# Cascade Mask R-CNN + FPN with a Focal-T backbone, COCO, 3x schedule with Swin's multi-scale +
# random-crop training (official README: 51.5 box AP, 87M parameters). Heads as in the Swin
# paper's Cascade Mask R-CNN, which the authors say they follow
# (_base_/cascade_mask_rcnn_4conv1fc_giou.py: 4conv1fc box heads with SyncBN, GIoU loss). Recipe in
# _base_/swin_coco_instance_ms_crop_3x.py (AdamW lr 1e-4, weight decay 0.05, 36 epochs, steps at
# 27 and 33, 8 GPUs x 2 images).
_base_ = [
    '../_base_/cascade_mask_rcnn_4conv1fc_giou.py',
    '../_base_/swin_coco_instance_ms_crop_3x.py',
    '../_base_/backbones/focal_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[96, 192, 384, 768]))
