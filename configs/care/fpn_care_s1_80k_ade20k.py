# Semantic FPN with a CARE-S1 backbone, ADE20K 512x512, 80k iterations: the CARE-S0 recipe
# (fpn_care_s0_80k_ade20k.py) with the S1 backbone (same widths as S0, deeper).
_base_ = ['./fpn_care_s0_80k_ade20k.py']

# official CARE-S1 ImageNet-1k weights (CARETrans_S1.pth.tar); fill in your path.
pretrained = 'checkpoints/CARETrans_S1.pth.tar'
model = dict(backbone=dict(arch='s1', init_cfg=dict(checkpoint=pretrained)))
