# The Swin detection recipe, 3x schedule with multi-scale training and random crops (Swin sec. 4.2;
# mmdet's swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py, a DETR-style augmentation): with
# probability 1/2 the shorter side is drawn from 480..800 (step 32, longer side <= 1333); otherwise
# the image is first resized to a shorter side of 400/500/600, cropped to an absolute random size in
# [384, 600] and then resized as in the first branch. 36 epochs, lr x0.1 after epochs 27 and 33;
# optimiser, warm-up and weight-decay exclusions as the 1x recipe.
_base_ = ['./swin_coco_instance_1x.py']

_multi_scale = [(480 + 32 * i, 1333) for i in range(11)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
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
