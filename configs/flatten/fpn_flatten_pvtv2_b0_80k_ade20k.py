# Semantic FPN with a FLatten-PVTv2-B0 backbone, ADE20K 512x512, 80k iterations: the FLatten-PVT-T
# recipe (fpn_flatten_pvt_t_80k_ade20k.py, PVT's segmentation protocol, which PVTv2 keeps) with the
# PVTv2-B0 backbone; FLattenPVTv2 takes the same drop_path_rate and out_indices.
_base_ = ['./fpn_flatten_pvt_t_80k_ade20k.py']

# official FLatten-PVTv2-B0 ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_pvt_v2_b0.pth'
model = dict(
    backbone=dict(type='FLattenPVTv2', arch='b0', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[32, 64, 160, 256]))
