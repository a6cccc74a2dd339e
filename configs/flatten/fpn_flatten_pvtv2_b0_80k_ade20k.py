# Semantic FPN with a FLatten-PVTv2-B0 backbone, ADE20K 512x512, 80k iterations.
# Recipe of PVT's segmentation experiments (as configs/fpn_flatten_pvt_t_80k_ade20k.py): AdamW
# lr 1e-4, weight decay 1e-4, poly decay with power 0.9, batch 16 (4 GPUs x 4 images).
# Data in the standard layout data/ade/ADEChallengeData2016/.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

crop_size = (512, 512)
# official FLatten-PVTv2-B0 ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_pvt_v2_b0.pth'
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='FLattenPVTv2',
        arch='b0',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[32, 64, 160, 256], out_channels=256, num_outs=4),
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
