# FLatten-CSWin-T trained from scratch on ImageNet-1k with the official recipe (FLatten-Transformer
# cfgs/flatten_cswin_t.yaml + main_ema.py, README command `--model-ema-decay 0.99984`; official eval
# log 83.130 / 96.376 top-1 / top-5): 8 GPUs x 256 images, AdamW lr 5e-4 x 2048 / 512, weight decay
# 0.05, warm-up 20 epochs from 1e-6 / 5e-4 of the lr, cosine to 1e-5 / 5e-4 of it at epoch 300 and
# the 10 cool-down epochs at that floor, no gradient clipping, drop path 0.2, and an exponential
# moving average of the weights (decay 0.99984 per iteration, mmengine momentum 1 - 0.99984) that is
# validated and saved as the checkpoint's state_dict (EMAHook keeps the raw weights under
# ema_state_dict, for resuming). Shared recipe: _base_/imagenet_cls_300e.py.
_base_ = ['../_base_/models/cls_flatten_cswin_t.py', '../_base_/imagenet_cls_300e.py']

model = dict(backbone=dict(drop_path_rate=0.2))
train_dataloader = dict(batch_size=256)
optim_wrapper = dict(optimizer=dict(lr=5e-4 * 2048 / 512))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6 / 5e-4, by_epoch=True, begin=0, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=1e-5 / 5e-4, by_epoch=True, begin=20, end=300,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=310)
auto_scale_lr = dict(base_batch_size=2048)
custom_hooks = [dict(type='EMAHook', momentum=1 - 0.99984, priority='ABOVE_NORMAL')]
