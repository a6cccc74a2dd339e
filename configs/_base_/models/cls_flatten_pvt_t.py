# FLatten-PVT-T as an ImageNet classifier in mmpretrain terms. The official classifier (FLatten-
# Transformer models/flatten_pvt.py) averages the stage-4 tokens, without a final norm, and feeds
# them to one Linear layer: here the backbone's last stage (out_indices=(3, )), mmpretrain's
# GlobalAveragePooling and LinearClsHead. Label smoothing 0.1 as in the DeiT recipe (Mixup / CutMix
# come from the recipe's data preprocessor, _base_/imagenet_cls_300e.py). Initialisation: the
# backbone's own (EffBackbone.default_init_cfg, from scratch: init_cfg=None); the head by the
# classifier's rules below, as mmpretrain's Swin / DeiT configs do.
_base_ = ['./cls_linear_head.py']

model = dict(
    backbone=dict(
        type='FLattenPVT',
        arch='tiny',
        drop_path_rate=0.1,  # flatten_pvt_t.yaml
        out_indices=(3, ),
        init_cfg=None),
    head=dict(in_channels=512))
