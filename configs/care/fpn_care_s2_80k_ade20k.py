# Semantic FPN with a CARE-S2 backbone, ADE20K 512x512, 80k iterations: the CARE-S0 recipe
# (fpn_care_s0_80k_ade20k.py) with the S2 backbone and its channels.
_base_ = ['./fpn_care_s0_80k_ade20k.py']

# official CARE-S2 ImageNet-1k weights (CARETrans_S2.pth.tar); fill in your path.
pretrained = 'checkpoints/CARETrans_S2.pth.tar'
model = dict(
    backbone=dict(arch='s2', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[32, 64, 192, 1536]))
