# COCO instance segmentation with the Swin detection recipe's 3x schedule and multi-scale +
# random-crop training (Swin sec. 4.2; mmdet's swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py):
# the augmentation of coco_ms_crop_augmentation.py, 36 epochs with lr x0.1 after epochs 27 and 33
# (swin_det_schedule_3x.py); optimiser, warm-up and weight-decay exclusions (FLA's
# positional_encoding included) as swin_coco_instance_1x.py.
_base_ = [
    'mmdet::_base_/datasets/coco_instance.py',
    './swin_det_schedule_3x.py',
    './coco_ms_crop_augmentation.py',
]

optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'positional_encoding': dict(decay_mult=0.)}))

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    _base_.pop('_ms_crop'),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
