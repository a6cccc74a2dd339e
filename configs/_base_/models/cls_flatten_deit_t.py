# FLatten-DeiT-T as an ImageNet-1k classifier (FLatten paper Table 3). No official FLatten-DeiT
# code exists; the classifier is DeiT's (Touvron et al., 2021): final LayerNorm `norm` (eps 1e-6)
# on the last block, the cls token, a linear head; drop path 0.1 (DeiT-T). DeiT's distillation
# token and head are not built.
_base_ = ['./cls_linear_head.py']

model = dict(
    backbone=dict(
        type='FLattenDeiT',
        arch='tiny',
        drop_path_rate=0.1,
        out_indices=-1,
        out_type='cls_token',
        final_norm=True),
    neck=None,  # the class token is the feature
    head=dict(in_channels=192))
