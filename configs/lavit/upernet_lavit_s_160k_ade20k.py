# UperNet with a LaViT-S backbone, ADE20K 512x512, 160k iterations (LaViT paper sec. 4.4,
# Table 4: 47.2 mIoU single-scale, 49.5 multi-scale). The paper follows Swin's segmentation
# protocol, so everything but the backbone comes from mmseg's swin-tiny UperNet config: AdamW
# lr 6e-5, betas (0.9, 0.999), weight decay 0.01, linear warm-up over 1500 iterations, poly
# decay (power 1.0); 8 GPUs x 2 images; UperNet (PPM 1/2/3/6, 512 channels) + FCN auxiliary
# head on stage 3 (weight 0.4). No weight decay for position embeddings and norms.
# Less attention in windows of the 224x224 training grid (la_mode='window'); `loss_diag` is the
# diagonality-preserving loss (model.with_backbone_aux_loss=False turns it off).
_base_ = [
    'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
    '../_base_/backbones/lavit_s.py',
]

model = dict(
    type='AuxLossEncoderDecoder',
    with_backbone_aux_loss=True,
    backbone=dict(_base_.pop('backbone'), drop_path_rate=0.2),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))

optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys=dict(
        _delete_=True,
        pos_embed=dict(decay_mult=0.),
        norm=dict(decay_mult=0.))))
