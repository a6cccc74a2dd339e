# Semantic FPN with a FLatten-PVT-T backbone, ADE20K 512x512, 80k iterations; the recipe of PVT's
# segmentation experiments in _base_/semantic_fpn_ade20k_80k.py (AdamW lr 1e-4, weight decay 1e-4,
# poly decay with power 0.9, batch 16). Data in data/ade/ADEChallengeData2016/ (standard layout).
_base_ = [
    '../_base_/semantic_fpn_ade20k_80k.py',
    '../_base_/backbones/flatten_pvt_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[64, 128, 320, 512]))
