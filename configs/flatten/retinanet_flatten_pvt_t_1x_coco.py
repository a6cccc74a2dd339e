# RetinaNet + FPN with a FLatten-PVT-T backbone, COCO detection, 1x schedule.
# mmdet's PVT RetinaNet recipe (pvt/retinanet_pvt-t_fpn_1x_coco.py): AdamW lr 1e-4, weight decay
# 1e-4, 12 epochs with steps at 8 and 11, 8 GPUs x 2 images; only the backbone differs.
_base_ = [
    'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py',
    '../_base_/backbones/flatten_pvt_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001))
