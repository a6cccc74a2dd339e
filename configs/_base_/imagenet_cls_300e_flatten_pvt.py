# The ImageNet-1k recipe of FLatten's PVT / PVTv2 classifiers (FLatten-Transformer
# cfgs/flatten_pvt_t.yaml, flatten_pvt_v2_b0.yaml + main.py): the shared recipe with a linear
# warm-up over 5 epochs from 1e-6 / 5e-4 of the lr, cosine to 1e-5 / 5e-4 of it at epoch 300, then
# the 10 cool-down epochs at that floor which the official loop runs (EPOCHS + COOLDOWN_EPOCHS).
_base_ = ['./imagenet_cls_300e.py']

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6 / 5e-4, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=1e-5 / 5e-4, by_epoch=True, begin=5, end=300,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=310)
