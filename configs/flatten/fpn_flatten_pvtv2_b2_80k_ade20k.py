# Semantic FPN with a FLatten-PVTv2-B2 backbone, ADE20K 512x512, 80k iterations (recipe of
# fpn_flatten_pvtv2_b0_80k_ade20k.py: AdamW lr 1e-4, weight decay 1e-4, poly 0.9, batch 16).
_base_ = ['./fpn_flatten_pvtv2_b0_80k_ade20k.py']

# FLatten-PVTv2-B2 ImageNet-1k weights (not released by FLatten; train or convert your own)
pretrained = 'checkpoints/flatten_pvt_v2_b2.pth'
model = dict(
    backbone=dict(arch='b2', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512]))
