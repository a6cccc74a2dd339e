# RetinaNet + FPN with a Focal-T backbone, COCO detection, 3x schedule (official README: 45.5 AP):
# the 1x config (retinanet_focal_t_1x_coco.py) on Swin's 3x recipe, box-only: multi-scale +
# random-crop training (_base_/coco_ms_crop_augmentation.py), 36 epochs with steps at 27 and 33
# (_base_/swin_det_schedule_3x.py).
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    '../_base_/swin_det_schedule_3x.py',
    '../_base_/coco_ms_crop_augmentation.py',
    '../_base_/backbones/focal_t.py',
]

model = dict(
    backbone=dict(_base_.pop('backbone'), out_indices=(1, 2, 3)),
    neck=dict(in_channels=[192, 384, 768], start_level=0, add_extra_convs='on_input', num_outs=5))

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomFlip', prob=0.5),
    _base_.pop('_ms_crop'),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
