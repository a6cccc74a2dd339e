# FLatten-Swin-T trained from scratch on ImageNet-1k with the official recipe (FLatten-Transformer
# cfgs/flatten_swin_t.yaml on the Swin code base's defaults in config.py; official eval log
# 82.106 / 95.900 top-1 / top-5): 8 GPUs x 128 images, AdamW lr 5e-4 x 1024 / 512, weight decay
# 0.05, warm-up 20 epochs from 5e-7 / 5e-4 of the lr, cosine to 5e-6 / 5e-4 of it over 300 epochs
# (the shared recipe's schedule), gradients clipped at norm 5, no EMA, drop path 0.2. Shared
# recipe: _base_/imagenet_cls_300e.py.
_base_ = ['../_base_/models/cls_flatten_swin_t.py', '../_base_/imagenet_cls_300e.py']

model = dict(backbone=dict(drop_path_rate=0.2))
optim_wrapper = dict(clip_grad=dict(max_norm=5.0))
