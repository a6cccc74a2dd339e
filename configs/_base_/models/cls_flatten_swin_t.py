# FLatten-Swin-T as the official ImageNet-1k classifier (FLatten paper sec. 5.1; official
# flatten_swin_t.yaml): focused linear attention over the whole map in stages 1-2, 7x7 shifted
# windows in stages 3-4 with the official rule for maps not larger than a window (one unshifted
# window: stage 4 at 224x224), then the official final LayerNorm `norm` (backbone.final_norm),
# global average pooling and a linear head. Drop path 0.2 (yaml). Weights from the official release
# load with tools/model_converters/official2mmpretrain.py. The data, schedule, Mixup/CutMix
# (train_cfg.augments) and EMA come from the recipe config that takes this model.
_base_ = ['./cls_linear_head.py']

model = dict(
    backbone=dict(
        type='FLattenSwin',
        arch='tiny',
        attn_type='LLSS',
        window_size=7,
        official_window_rule=True,
        drop_path_rate=0.2,
        out_indices=(3, ),
        final_norm=True),
    head=dict(in_channels=768))
