# The demo: configs/mask_rcnn_flatten_pvt_t_1x.py unchanged in model and optimiser, pointed at the
# embedded shapes dataset (python -m mmeffvit.datasets.shapes --out data/shapes). Overrides: data
# root, classes, image scale (CPU-sized) and a short iteration-based schedule. No ImageNet weights.
# RoIAlign samples 2x2 points per bin instead of adaptively: mmcv's CPU RoIAlign backward with
# adaptive sampling grows with the proposals' size and came to dominate CPU training (25 s/iter).
_base_ = ['../flatten/mask_rcnn_flatten_pvt_t_1x_coco.py']

data_root = 'data/shapes/coco/'
classes = ('circle', 'square', 'triangle', 'star')
metainfo = dict(
    classes=classes, palette=[(220, 20, 60), (0, 130, 230), (60, 180, 75), (250, 170, 30)])
img_scale = (320, 320)
max_iters = 300

model = dict(
    backbone=dict(init_cfg=None),
    roi_head=dict(
        bbox_roi_extractor=dict(roi_layer=dict(sampling_ratio=2)),
        mask_roi_extractor=dict(roi_layer=dict(sampling_ratio=2)),
        bbox_head=dict(num_classes=len(classes)), mask_head=dict(num_classes=len(classes))))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train2017.json',
        data_prefix=dict(img='train2017/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_val2017.json',
        data_prefix=dict(img='val2017/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator

train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
optim_wrapper = dict(optimizer=dict(lr=0.0002), clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=max_iters,
         milestones=[int(max_iters * 0.75)], gamma=0.1),
]
default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=2))
log_processor = dict(by_epoch=False)
