# The official L2ViT 3x COCO recipe: as l2vit_coco_1x.py (same multi-scale + crop augmentation,
# optimiser and warm-up), 36 epochs with lr x0.1 after epochs 27 and 33.
_base_ = ['./l2vit_coco_1x.py']

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
default_hooks = dict(checkpoint=dict(interval=max_epochs))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
         gamma=0.1),
]
