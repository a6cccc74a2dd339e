# Semantic FPN with a FLatten-PVT-L backbone, ADE20K 512x512, 80k iterations (recipe of
# fpn_flatten_pvt_t_80k_ade20k.py: AdamW lr 1e-4, weight decay 1e-4, poly 0.9, batch 16).
_base_ = ['./fpn_flatten_pvt_t_80k_ade20k.py']

# FLatten-PVT-L ImageNet-1k weights (not released by FLatten; train or convert your own)
pretrained = 'checkpoints/flatten_pvt_l.pth'
# drop_path_rate: the classification recipe's stochastic depth for PVT-L
model = dict(backbone=dict(arch='large', drop_path_rate=0.3, init_cfg=dict(checkpoint=pretrained)))
