# lavit/retinanet_lavit_t_3x_coco.py on the embedded shapes data (CPU-sized): model, optimiser,
# `loss_diag` and the repeated, multi-scale training set kept, scaled down (shorter side 256-320
# instead of 640-800); otherwise the overrides of every demo detector (_base_/shapes_coco_demo.py),
# with a second lr step at 9/10 of the iterations as the 3x schedule has.
_base_ = ['../lavit/retinanet_lavit_t_3x_coco.py', '../_base_/shapes_coco_demo.py']
__shapes = _base_.pop('shapes_coco').detection
# the base's training set is RepeatDataset(times=3) of the COCO set: the shapes set goes inside
__shapes.train_dataloader.dataset = dict(dataset=__shapes.train_dataloader.dataset)
_base_.merge(__shapes)

model = dict(bbox_head=dict(num_classes=len(_base_.classes)))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomResize', scale=[(534, 256), (534, 320)], keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(dataset=dict(pipeline=train_pipeline)))
param_scheduler = [
    _base_.param_scheduler[0],
    dict(_base_.param_scheduler[1], milestones=[int(_base_.max_iters * f) for f in (0.75, 0.9)]),
]
