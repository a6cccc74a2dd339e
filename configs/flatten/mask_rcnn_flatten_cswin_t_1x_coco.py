# Mask R-CNN + FPN with a FLatten-CSWin-T backbone, COCO instance segmentation, 1x schedule
# (FLatten paper sec. 5.3; CSWin's detection protocol is Swin's). Recipe in
# _base_/swin_coco_instance_1x.py: AdamW lr 1e-4, weight decay 0.05 (none for norms and FLA
# positional encodings), 1000-iteration linear warm-up, 12 epochs with steps at 8 and 11,
# 8 GPUs x 2 images. Data in the standard layout data/coco/.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/swin_coco_instance_1x.py',
    '../_base_/backbones/flatten_cswin_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[64, 128, 256, 512]))

# the stem LayerNorm keeps its official name stage1_conv_embed.2, which 'norm' does not match
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'stage1_conv_embed.2': dict(decay_mult=0.)}))
