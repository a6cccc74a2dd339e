# Mask R-CNN + FPN with a FLatten-Swin-T backbone, COCO instance segmentation, 3x schedule with
# Swin's multi-scale + random-crop training (FLatten paper sec. 5.3, Table 2). Recipe in
# _base_/swin_coco_instance_ms_crop_3x.py: as the 1x recipe, 36 epochs with steps at 27 and 33.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/swin_coco_instance_ms_crop_3x.py',
    '../_base_/backbones/flatten_swin_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[96, 192, 384, 768]))
