# Semantic FPN with a LaViT-S backbone, ADE20K 512x512, 80k iterations (LaViT paper sec. 4.4,
# Table 4: 44.1 mIoU); the recipe of PVT's segmentation experiments in
# _base_/semantic_fpn_ade20k_80k.py (AdamW lr 1e-4, weight decay 1e-4, poly decay with power 0.9,
# batch 16). Data: data/ade/ADEChallengeData2016/.
# Less attention in windows of the 224x224 training grid (la_mode='window', any size); the
# diagonality-preserving loss is logged as `loss_diag` (model.with_backbone_aux_loss=False: off).
_base_ = [
    '../_base_/semantic_fpn_ade20k_80k.py',
    '../_base_/backbones/lavit_s.py',
]

model = dict(
    type='AuxLossEncoderDecoder',  # EncoderDecoder + the backbone's auxiliary losses
    with_backbone_aux_loss=True,
    backbone=_base_.pop('backbone'),
    neck=dict(in_channels=[64, 128, 320, 512]))
