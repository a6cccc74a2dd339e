# Mask R-CNN + FPN with a CARE-S0 backbone, COCO instance segmentation, 1x schedule.
# CARE publishes no detection code or config; this follows the protocol of the mobile backbones
# CARE compares with (EfficientFormerV2, MobileViGv2; care.md sec. 10): AdamW lr 2e-4, weight
# decay 0.05, linear warm-up over 500 iterations from 1e-6x, 12 epochs with lr x0.1 after epochs
# 8 and 11, single-scale 1333x800 training with flips, 8 GPUs x 2 images. Data in data/coco/.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/backbones/care_s0.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[32, 64, 128, 1024]))

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0002, betas=(0.9, 0.999),
                   weight_decay=0.05))
