# COCO recipe of the official L2ViT detection configs (ChuanyangZheng/L2ViT,
# object_detection/configs/L2ViT, mmdet 2.x), ported to mmdet 3.x: AdamW lr 1e-4, betas
# (0.9, 0.999), weight decay 0.05 with no parameter-wise exceptions, no gradient clipping, fp32,
# linear warm-up over 500 iterations from 0.001x, 12 epochs with lr x0.1 after epochs 8 and 11,
# 2 images per GPU (8 GPUs assumed: batch 16). The official 1x AND 3x configs both train with the
# DETR-style multi-scale + random-crop augmentation of Swin's 3x recipe
# (coco_ms_crop_augmentation.py).
# Single-scale 1333x800 testing; evaluation only after the last epoch (as the official configs).
# The two pipelines below (boxes + masks, boxes only) are picked by the model configs. The 3x
# recipe (l2vit_coco_3x.py) inherits this file and changes only the schedule.
_base_ = [
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
    './coco_ms_crop_augmentation.py',
]

l2vit_pipeline_instance = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    _base_._ms_crop,
    dict(type='PackDetInputs'),
]
l2vit_pipeline_box = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomFlip', prob=0.5),
    _base_._ms_crop,
    dict(type='PackDetInputs'),
]

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
default_hooks = dict(checkpoint=dict(interval=max_epochs))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, betas=(0.9, 0.999),
                   weight_decay=0.05))
