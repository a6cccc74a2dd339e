# UperNet with a Focal-T backbone, ADE20K 512x512, 160k iterations (official README: 45.8 mIoU,
# 47.0 multi-scale; 62M parameters). Segmentation code was never released; the README says it
# follows Swin-Transformer-Semantic-Segmentation, so everything but the backbone comes from mmseg's
# swin-tiny UperNet config: AdamW lr 6e-5, betas (0.9, 0.999), weight decay 0.01, linear warm-up
# over 1500 iterations from 1e-6x, then poly decay (power 1.0) to 0 at 160k; 8 GPUs x 2 images;
# UperNet (PPM scales 1/2/3/6, 512 channels, SyncBN) + FCN auxiliary head on stage 3 (weight 0.4).
# No weight decay for norms and the three relative position bias tables (substring match).
# Data in data/ade/ADEChallengeData2016/.
_base_ = [
    'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
    '../_base_/backbones/focal_t.py',
]

# the heads of the base fit Focal-T's widths (Swin-T's, 96-768) and ADE20K's 150 classes
model = dict(backbone=dict(_base_.pop('backbone'), drop_path_rate=0.3))

optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys=dict(
        _delete_=True,
        relative_position_bias_table=dict(decay_mult=0.),
        norm=dict(decay_mult=0.))))
