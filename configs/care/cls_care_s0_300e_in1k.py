# CARE-S0 trained from scratch on ImageNet-1k with the official recipe (CARE-Transformer
# cmd/train.sh + train.py defaults; README: 78.4 top-1): 12 GPUs x 128 = 1536 images, AdamW lr
# 2.5e-3 for that batch (not scaled from 5e-4: --auto-scale-lr scales from 1536), weight decay
# 0.05, warm-up 20 epochs from 1e-6 / 2.5e-3 of the lr, cosine to 1e-5 / 2.5e-3 of it at epoch 300
# and the 10 cool-down epochs of timm's scheduler, no gradient clipping, no EMA, drop path 0.1.
# Not reproduced: the DeiT hard distillation from a RegNetY-16GF teacher (mmpretrain trains no
# distillation head; the model base's dist head is averaged at test time) and the random
# interpolation of the crops (bicubic here). Shared recipe: _base_/imagenet_cls_300e.py.
_base_ = ['../_base_/models/cls_care_s0.py', '../_base_/imagenet_cls_300e.py']

model = dict(backbone=dict(drop_path_rate=0.1))
optim_wrapper = dict(optimizer=dict(lr=2.5e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6 / 2.5e-3, by_epoch=True, begin=0, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=1e-5 / 2.5e-3, by_epoch=True, begin=20, end=300,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=310)
auto_scale_lr = dict(base_batch_size=1536)
