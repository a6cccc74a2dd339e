# FLatten-PVTv2-B0 trained from scratch on ImageNet-1k with the official recipe (FLatten-Transformer
# cfgs/flatten_pvt_v2_b0.yaml, the same as PVT-T's: official eval log 71.098 / 90.596 top-1 /
# top-5): 8 GPUs x 128 images, AdamW lr 5e-4 x 1024 / 512, weight decay 0.05, warm-up 5 epochs from
# 1e-6 / 5e-4 of the lr, cosine to 1e-5 / 5e-4 of it at epoch 300 and 10 cool-down epochs at that
# floor, no gradient clipping, no EMA, drop path 0.1. Shared recipe: _base_/imagenet_cls_300e.py.
_base_ = ['../_base_/models/cls_flatten_pvtv2_b0.py', '../_base_/imagenet_cls_300e_flatten_pvt.py']

model = dict(backbone=dict(drop_path_rate=0.1))
