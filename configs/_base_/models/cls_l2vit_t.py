# L2ViT-T as the official ImageNet-1k classifier (Zheng, arXiv 2501.16182; official
# classification/models/l2vit.py, L2ViT_Tiny): alternating local-window and clamped linear global
# attention blocks, the official final LayerNorm `norm` (backbone.final_norm), global average
# pooling and a linear head. Drop path 0.1 (the README gives 0.3 for B only; T's value is not
# published). The official runs keep an EMA of the weights (decay 0.9999): a recipe setting.
_base_ = ['./cls_linear_head.py']

model = dict(
    backbone=dict(
        type='L2ViT', arch='tiny', drop_path_rate=0.1, out_indices=(3, ), final_norm=True),
    head=dict(in_channels=768),
    init_cfg=[  # its LCM has BatchNorms
        dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
        dict(type='Constant', layer=['LayerNorm', '_BatchNorm'], val=1., bias=0.),
    ])
