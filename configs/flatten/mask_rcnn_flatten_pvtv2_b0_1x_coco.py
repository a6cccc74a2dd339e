# Mask R-CNN + FPN with a FLatten-PVTv2-B0 backbone, COCO instance segmentation, 1x schedule.
# Recipe of PVT's detection experiments (as configs/mask_rcnn_flatten_pvt_t_1x.py): AdamW lr 1e-4,
# weight decay 1e-4, 12 epochs with steps at 8 and 11, 8 GPUs x 2 images, single scale 1333x800.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official FLatten-PVTv2-B0 ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_pvt_v2_b0.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='FLattenPVTv2',
        arch='b0',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[32, 64, 160, 256]))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, weight_decay=0.0001))
