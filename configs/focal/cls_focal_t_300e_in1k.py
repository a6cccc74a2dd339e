# Focal-T trained from scratch on ImageNet-1k with the official recipe (Focal-Transformer
# classification/config.py + the Focal-T yaml in configs/, a Swin code base; paper Table 1: 82.2
# top-1): 8 GPUs x 128 images, AdamW lr 5e-4 x 1024 / 512, weight decay 0.05 (none on the
# relative-position tables), warm-up 20 epochs from 5e-7 / 5e-4 of the lr, cosine to 5e-6 / 5e-4 of
# it (the shared recipe's schedule), gradients clipped at norm 5, no EMA, drop path 0.2. The
# official runs used apex AMP O1: --amp here. Shared recipe: _base_/imagenet_cls_300e.py.
_base_ = ['../_base_/models/cls_focal_t.py', '../_base_/imagenet_cls_300e.py']

model = dict(backbone=dict(drop_path_rate=0.2))
optim_wrapper = dict(clip_grad=dict(max_norm=5.0))
