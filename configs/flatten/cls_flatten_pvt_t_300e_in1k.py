# FLatten-PVT-T trained from scratch on ImageNet-1k with the official recipe (FLatten-Transformer
# cfgs/flatten_pvt_t.yaml + main.py; paper sec. 5.1: 77.8 top-1, official eval log 77.758 / 93.910
# top-1 / top-5): 8 GPUs x 128 images, AdamW lr 5e-4 x 1024 / 512, weight decay 0.05, linear
# warm-up over 5 epochs from 1e-6 / 5e-4 of the lr, cosine to 1e-5 / 5e-4 of it at epoch 300, then
# the 10 cool-down epochs at that floor which the official loop runs (EPOCHS + COOLDOWN_EPOCHS), no
# gradient clipping, no EMA, drop path 0.1. Data, augmentation and optimiser: the shared recipe in
# _base_/imagenet_cls_300e.py; data in data/imagenet/{train,val}.
_base_ = ['../_base_/models/cls_flatten_pvt_t.py', '../_base_/imagenet_cls_300e_flatten_pvt.py']

model = dict(backbone=dict(drop_path_rate=0.1))
