# Semantic FPN with a LaViT-S backbone, ADE20K 512x512, 80k iterations (LaViT paper sec. 4.4,
# Table 4: 44.1 mIoU). PVT's segmentation recipe: AdamW lr 1e-4, weight decay 1e-4, poly decay
# with power 0.9, batch 16 (4 GPUs x 4 images). Data: data/ade/ADEChallengeData2016/.
# Less attention in windows of the 224x224 training grid (la_mode='window', any size); the
# diagonality-preserving loss is logged as `loss_diag` (model.with_backbone_aux_loss=False: off).
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

crop_size = (512, 512)
pretrained = 'checkpoints/lavit_s.pth'  # LaViT has no public weights: your own ImageNet-1k LaViT-S
model = dict(
    type='AuxLossEncoderDecoder',  # EncoderDecoder + the backbone's auxiliary losses
    with_backbone_aux_loss=True,
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='LaViT',
        arch='small',
        la_mode='window',
        diag_loss=dict(type='DiagonalityLoss', loss_weight=0.01),
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512], out_channels=256, num_outs=4),
    decode_head=dict(num_classes=150))

train_dataloader = dict(batch_size=4)

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.0001),
    clip_grad=None)
param_scheduler = [
    dict(type='PolyLR', power=0.9, eta_min=0.0, begin=0, end=80000, by_epoch=False)
]
