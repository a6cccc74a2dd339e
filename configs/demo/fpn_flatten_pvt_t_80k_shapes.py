# The segmentation demo: configs/fpn_flatten_pvt_t_80k_ade20k.py unchanged in model and optimiser,
# pointed at the ADE20K-layout copy of the embedded shapes dataset. Overrides: data root, classes
# (ADE20KDataset only accepts subsets of ADE's 150 names, so the plain BaseSegDataset reads the
# same layout), crop size (CPU-sized) and a short schedule. No ImageNet weights.
_base_ = ['../flatten/fpn_flatten_pvt_t_80k_ade20k.py']

data_root = 'data/shapes/ade/ADEChallengeData2016'
metainfo = dict(
    classes=('background', 'circle', 'square', 'triangle', 'star'),
    palette=[(120, 120, 120), (220, 20, 60), (0, 130, 230), (60, 180, 75), (250, 170, 30)])
crop_size = (256, 256)
max_iters = 300

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(init_cfg=None),
    decode_head=dict(num_classes=5))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(320, 256), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.9),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(320, 256), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
dataset = dict(
    type='BaseSegDataset', data_root=data_root, metainfo=metainfo, img_suffix='.jpg',
    seg_map_suffix='.png', reduce_zero_label=True)
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        dataset,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        dataset,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader

train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
optim_wrapper = dict(optimizer=dict(lr=0.0002))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', power=0.9, eta_min=0.0, begin=30, end=max_iters, by_epoch=False),
]
default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=2))
