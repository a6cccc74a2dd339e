# What every configs/demo segmentation config changes in its full-size config, written once: the
# ADE20K-layout copy of the embedded shapes data (python -m mmeffvit.datasets.shapes --out
# data/shapes; tools/demo.py generates it) with its 5 classes, read by the plain BaseSegDataset
# (ADE20KDataset only accepts subsets of ADE's 150 names), 256x256 crops from 320x256 rescales,
# batch 2, no ImageNet weights, and a short schedule (300 iterations: 30 warm-up iterations, then
# poly decay with power 0.9).
#
# Everything sits in the one dict `shapes_ade20k`: a demo config inherits two bases, its full-size
# config and this file, and mmengine refuses two bases that define the same key. The demo config
# applies it to what it inherits and drops it, in one line:
#     _base_.merge(_base_.pop('shapes_ade20k'))
# (see _base_/shapes_coco_demo.py). Names starting with two underscores never reach a config.
__data_root = 'data/shapes/ade/ADEChallengeData2016'
__metainfo = dict(
    classes=('background', 'circle', 'square', 'triangle', 'star'),
    palette=[(120, 120, 120), (220, 20, 60), (0, 130, 230), (60, 180, 75), (250, 170, 30)])
__crop_size = (256, 256)
__max_iters = 300

__train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(320, 256), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=__crop_size, cat_max_ratio=0.9),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
__test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(320, 256), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
__dataset = dict(
    type='BaseSegDataset', data_root=__data_root, metainfo=__metainfo, img_suffix='.jpg',
    seg_map_suffix='.png', reduce_zero_label=True)
__val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        __dataset,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=__test_pipeline))

shapes_ade20k = dict(
    data_root=__data_root,
    metainfo=__metainfo,
    crop_size=__crop_size,
    max_iters=__max_iters,
    model=dict(
        data_preprocessor=dict(size=__crop_size),
        backbone=dict(init_cfg=None),
        decode_head=dict(num_classes=len(__metainfo['classes']))),
    train_pipeline=__train_pipeline,
    test_pipeline=__test_pipeline,
    dataset=__dataset,
    train_dataloader=dict(
        batch_size=2,
        num_workers=0,
        persistent_workers=False,
        dataset=dict(
            __dataset,
            data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
            pipeline=__train_pipeline)),
    val_dataloader=__val_dataloader,
    test_dataloader=__val_dataloader,
    train_cfg=dict(type='IterBasedTrainLoop', max_iters=__max_iters, val_interval=__max_iters),
    param_scheduler=[
        dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
        dict(type='PolyLR', power=0.9, eta_min=0.0, begin=30, end=__max_iters, by_epoch=False),
    ],
    default_hooks=dict(
        logger=dict(interval=20),
        checkpoint=dict(by_epoch=False, interval=__max_iters, max_keep_ckpts=2)))
