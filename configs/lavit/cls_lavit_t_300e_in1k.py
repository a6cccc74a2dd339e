# LaViT-T trained from scratch on ImageNet-1k (paper sec. 4.1: 79.2 top-1 as reported by a third
# party; no official code, so no official recipe exists). The paper builds on PVT and trains with
# AdamW for 300 epochs; this takes PVT's / FLatten-PVT-T's recipe: 8 GPUs x 128 images, AdamW lr
# 5e-4 x 1024 / 512, weight decay 0.05 (none on the position embeddings, as mmpretrain's DeiT /
# ViT configs do), warm-up 5 epochs from 1e-6 / 5e-4 of the lr, cosine to 1e-5 / 5e-4 of it,
# no gradient clipping, no EMA, drop path 0.1. The diagonality-preserving loss (sec. 3.4) is the
# model base's. Shared recipe: _base_/imagenet_cls_300e.py.
_base_ = ['../_base_/models/cls_lavit_t.py', '../_base_/imagenet_cls_300e.py']

model = dict(backbone=dict(drop_path_rate=0.1))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'.pos_embed': dict(decay_mult=0.0)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6 / 5e-4, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=1e-5 / 5e-4, by_epoch=True, begin=5, end=300,
         convert_to_iter_based=True),
]
