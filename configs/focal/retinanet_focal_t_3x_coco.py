# RetinaNet + FPN with a Focal-T backbone, COCO detection, 3x schedule (official README: 45.5 AP).
# As retinanet_focal_t_1x.py with Swin's 3x data recipe (box-only version of
# _base_/swin_coco_instance_ms_crop_3x.py): with probability 1/2 the shorter side is drawn from
# 480..800 (step 32, longer side <= 1333), otherwise resize to 400/500/600, random absolute crop in
# [384, 600], then the multi-scale resize; 36 epochs with steps at 27 and 33.
_base_ = ['./retinanet_focal_t_1x_coco.py']

_multi_scale = [(480 + 32 * i, 1333) for i in range(11)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomChoice', transforms=[
        [dict(type='RandomChoiceResize', scales=_multi_scale, keep_ratio=True)],
        [
            dict(type='RandomChoiceResize', scales=[(400, 1333), (500, 1333), (600, 1333)],
                 keep_ratio=True),
            dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
                 allow_negative_crop=True),
            dict(type='RandomChoiceResize', scales=_multi_scale, keep_ratio=True),
        ],
    ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
         gamma=0.1),
]
