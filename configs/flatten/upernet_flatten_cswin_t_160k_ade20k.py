# UperNet with a FLatten-CSWin-T backbone, ADE20K 512x512, 160k iterations (FLatten paper
# sec. 5.2; CSWin's segmentation protocol is Swin's). Recipe of mmseg's Swin UperNet configs, which
# this inherits: AdamW lr 6e-5, betas (0.9, 0.999), weight decay 0.01 (none for norms and FLA
# positional encodings), linear warm-up over 1500 iterations, then poly decay with power 1.0,
# 8 GPUs x 2 images, auxiliary FCN head on stage 3 (weight 0.4).
# Data in the standard layout data/ade/ADEChallengeData2016/.
_base_ = ['mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py']
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official FLatten-CSWin-T ImageNet-1k weights (FLatten-Transformer release); fill in your path.
# They hold no per-stage out-norms norm0..norm3: those are reported as missing keys (expected).
pretrained = 'checkpoints/flatten_cswin_t.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='FLattenCSWin',
        arch='tiny',
        attn_types='LLSS',    # FLA + LePE over the whole map in stages 1-2, CSWin stripes in 3-4
        drop_path_rate=0.2,   # CSWin-T's ImageNet value (FLatten cfg); S 0.4, B 0.5
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[64, 128, 256, 512], num_classes=150),
    auxiliary_head=dict(in_channels=256, num_classes=150))

# FLA's positional_encoding is a learned position table like Swin's absolute_pos_embed; the stem
# LayerNorm keeps its official name stage1_conv_embed.2, which 'norm' does not match
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'positional_encoding': dict(decay_mult=0.),
        'stage1_conv_embed.2': dict(decay_mult=0.),
    }))
