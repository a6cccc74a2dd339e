# Mask R-CNN + FPN with a FLatten-PVT-T backbone, COCO instance segmentation, 1x schedule.
# Recipe of PVT's detection experiments (mmdet's pvt/ configs): AdamW lr 1e-4, weight decay 1e-4,
# 12 epochs with steps at 8 and 11, 8 GPUs x 2 images. Data in the standard layout data/coco/.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/backbones/flatten_pvt_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001))
