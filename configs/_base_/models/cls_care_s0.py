# CARE-S0 as the official ImageNet-1k classifier (Zhou et al., CVPR 2025; official CARETrans_S0
# and cmd/train.sh): the released network, whose last block is the non-residual expansion to 1024
# channels (drop path applied to it as in the official code), global average pooling, then the
# official two heads, each GELU -> LayerNorm -> Dropout -> Linear, averaged at prediction
# (CAREClsHead: the official `head` / `dist_head` tensors load as head.{norm,fc} /
# head.{dist_norm,dist_fc}). The official recipe trains `dist_head` by hard distillation from a
# RegNetY-160 teacher, which mmpretrain's ImageClassifier does not run: here both heads learn the
# labels (see CAREClsHead). Drop path 0.1.
_base_ = ['./cls_linear_head.py']

model = dict(
    backbone=dict(
        type='CARE',
        arch='s0',
        last_block='expanded',
        last_block_drop_path=True,
        drop_path_rate=0.1,
        out_indices=(3, )),
    # the head keeps its own official init (trunc-normal linears)
    head=dict(
        _delete_=True,
        type='CAREClsHead',
        num_classes=1000,
        in_channels=1024,
        dist_head=True,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
        dict(type='Constant', layer=['LayerNorm', '_BatchNorm'], val=1., bias=0.),
    ])
