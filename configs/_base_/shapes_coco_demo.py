# What every configs/demo detection config changes in its full-size config, written once: the
# embedded shapes data in COCO layout (python -m mmeffvit.datasets.shapes --out data/shapes;
# tools/demo.py generates it), its 4 classes, 320x320 images, batch 2, no ImageNet weights, and a
# short iteration-based schedule (300 iterations, 50 warm-up iterations, lr x0.1 after 3/4 of them,
# gradients clipped at norm 5).
#
# Everything sits in the one dict `shapes_coco` (`instance`: Mask R-CNN, boxes and masks;
# `detection`: boxes only): a demo config inherits two bases, its full-size config and this file,
# and mmengine refuses two bases that define the same key. The demo config applies its part to
# what it inherits and drops the dict, in one line:
#     _base_.merge(_base_.pop('shapes_coco').instance)
# (ConfigDict.merge follows the inheritance rules: dicts merge key by key, `_delete_` replaces,
# lists and other values replace), so its resolved config holds exactly the keys below and no
# `shapes_coco`. Names starting with two underscores never reach a config (mmengine drops them),
# nor do functions.
__data_root = 'data/shapes/coco/'
__classes = ('circle', 'square', 'triangle', 'star')
__metainfo = dict(
    classes=__classes, palette=[(220, 20, 60), (0, 130, 230), (60, 180, 75), (250, 170, 30)])
__img_scale = (320, 320)
__max_iters = 300


def __overrides(with_mask):
    """The keys a demo detector config takes, for a model with or without a mask head."""
    load_annotations = dict(type='LoadAnnotations', with_bbox=True)
    if with_mask:
        load_annotations['with_mask'] = True
    train_pipeline = [
        dict(type='LoadImageFromFile'),
        load_annotations,
        dict(type='Resize', scale=__img_scale, keep_ratio=True),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackDetInputs'),
    ]
    test_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=__img_scale, keep_ratio=True),
        load_annotations,
        dict(type='PackDetInputs',
             meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
    ]
    val_dataloader = dict(
        batch_size=1,
        num_workers=0,
        persistent_workers=False,
        dataset=dict(
            data_root=__data_root,
            metainfo=__metainfo,
            ann_file='annotations/instances_val2017.json',
            data_prefix=dict(img='val2017/'),
            pipeline=test_pipeline))
    val_evaluator = dict(ann_file=__data_root + 'annotations/instances_val2017.json')
    return dict(
        data_root=__data_root,
        classes=__classes,
        metainfo=__metainfo,
        img_scale=__img_scale,
        max_iters=__max_iters,
        model=dict(backbone=dict(init_cfg=None)),
        train_pipeline=train_pipeline,
        test_pipeline=test_pipeline,
        train_dataloader=dict(
            batch_size=2,
            num_workers=0,
            persistent_workers=False,
            sampler=dict(type='InfiniteSampler', shuffle=True),
            dataset=dict(
                data_root=__data_root,
                metainfo=__metainfo,
                ann_file='annotations/instances_train2017.json',
                data_prefix=dict(img='train2017/'),
                pipeline=train_pipeline)),
        val_dataloader=val_dataloader,
        test_dataloader=val_dataloader,
        val_evaluator=val_evaluator,
        test_evaluator=val_evaluator,
        train_cfg=dict(_delete_=True, type='IterBasedTrainLoop', max_iters=__max_iters,
                       val_interval=__max_iters),
        optim_wrapper=dict(clip_grad=dict(max_norm=5.0)),
        param_scheduler=[
            dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
            dict(type='MultiStepLR', by_epoch=False, begin=0, end=__max_iters,
                 milestones=[int(__max_iters * 0.75)], gamma=0.1),
        ],
        default_hooks=dict(
            logger=dict(interval=20),
            checkpoint=dict(by_epoch=False, interval=__max_iters, max_keep_ckpts=2)),
        log_processor=dict(by_epoch=False))


shapes_coco = dict(instance=__overrides(with_mask=True), detection=__overrides(with_mask=False))
