# UperNet with a FLatten-CSWin-T backbone, ADE20K 512x512, 160k iterations (FLatten paper
# sec. 5.2; CSWin's segmentation protocol is Swin's). Recipe of mmseg's Swin UperNet configs, which
# this inherits: AdamW lr 6e-5, betas (0.9, 0.999), weight decay 0.01 (none for norms and FLA
# positional encodings), linear warm-up over 1500 iterations, then poly decay with power 1.0,
# 8 GPUs x 2 images, auxiliary FCN head on stage 3 (weight 0.4).
# Data in the standard layout data/ade/ADEChallengeData2016/.
_base_ = [
    'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
    '../_base_/backbones/flatten_cswin_t.py',
]

model = dict(
    backbone=_base_.pop('backbone'),
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))

# FLA's positional_encoding is a learned position table like Swin's absolute_pos_embed; the stem
# LayerNorm keeps its official name stage1_conv_embed.2, which 'norm' does not match
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'positional_encoding': dict(decay_mult=0.),
        'stage1_conv_embed.2': dict(decay_mult=0.),
    }))
