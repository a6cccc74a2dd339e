# L2ViT-T trained from scratch on ImageNet-1k with the official recipe (L2ViT README + main.py
# defaults, a ConvNeXt code base; README: 83.1 top-1): 8 GPUs x 128 images x 4 accumulated steps =
# 4096 images per update, AdamW lr 4e-3, weight decay 0.05, warm-up 20 epochs from 0, cosine to
# 1e-6 at epoch 300, no gradient clipping, an exponential moving average of the weights (decay
# 0.9999, BatchNorm statistics averaged too, as timm's ModelEma does) that is validated and saved
# as the checkpoint's state_dict. Drop path 0.1: the README gives only B's (0.3); 0.1 is
# ConvNeXt-T's and the backbone base's value. --auto-scale-lr sees 8 x 128 per step (mmengine
# does not count the accumulation), hence base_batch_size 1024. Shared recipe:
# _base_/imagenet_cls_300e.py.
_base_ = ['../_base_/models/cls_l2vit_t.py', '../_base_/imagenet_cls_300e.py']

model = dict(backbone=dict(drop_path_rate=0.1))
optim_wrapper = dict(optimizer=dict(lr=4e-3), accumulative_counts=4)
param_scheduler = [
    # mmengine's chained LinearLR cannot start from exactly 0
    dict(type='LinearLR', start_factor=1e-6, by_epoch=True, begin=0, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=1e-6 / 4e-3, by_epoch=True, begin=20, end=300,
         convert_to_iter_based=True),
]
auto_scale_lr = dict(base_batch_size=1024)
custom_hooks = [
    dict(type='EMAHook', momentum=1e-4, update_buffers=True, priority='ABOVE_NORMAL')
]
