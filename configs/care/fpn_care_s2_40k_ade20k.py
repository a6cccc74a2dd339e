# Semantic FPN with a CARE-S2 backbone, ADE20K 512x512, 40k iterations: the 80k config
# (fpn_care_s2_80k_ade20k.py) on mmseg's 40k schedule length.
_base_ = ['./fpn_care_s2_80k_ade20k.py']

param_scheduler = [
    dict(type='PolyLR', power=0.9, eta_min=0.0, begin=0, end=40000, by_epoch=False)
]
train_cfg = dict(max_iters=40000)
