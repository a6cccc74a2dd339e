# The DETR-style multi-scale + random-crop training augmentation of Swin's 3x detection recipe
# (Swin sec. 4.2; mmdet's swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py), which the official
# L2ViT configs use at 1x and 3x: with probability 1/2 the shorter side is drawn from 480..800
# (step 32, longer side <= 1333); otherwise the image is first resized to a shorter side of
# 400/500/600, cropped to an absolute random size in [384, 600] and then resized as in the first
# branch. `_ms_crop` is the transform that goes between RandomFlip and PackDetInputs in a training
# pipeline; a config that only needs it there takes it with `_base_.pop('_ms_crop')`.
_multi_scale = [(480 + 32 * i, 1333) for i in range(11)]
_ms_crop = dict(type='RandomChoice', transforms=[
    [dict(type='RandomChoiceResize', scales=_multi_scale, keep_ratio=True)],
    [
        dict(type='RandomChoiceResize', scales=[(400, 1333), (500, 1333), (600, 1333)],
             keep_ratio=True),
        dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
             allow_negative_crop=True),
        dict(type='RandomChoiceResize', scales=_multi_scale, keep_ratio=True),
    ],
])
