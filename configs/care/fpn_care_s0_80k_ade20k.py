# Semantic FPN with a CARE-S0 backbone, ADE20K 512x512, 80k iterations. CARE publishes no
# segmentation code or config; this is the Semantic FPN protocol of the mobile backbones CARE
# compares with (EfficientFormerV2, MobileViGv2; care.md sec. 10): AdamW lr 2e-4, weight decay
# 1e-4, poly decay (power 0.9) to 0, 8 GPUs x 4 images, 512x512 crops from 2048x512 rescales
# (ratio 0.5-2.0), evaluation/checkpoints every 4k iterations. Data in data/ade/.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

crop_size = (512, 512)
# official CARE-S0 ImageNet-1k weights (CARETrans_S0.pth.tar, Google Drive folder of
# zhouyuan888888/CARE-Transformer; a raw state dict, the two classifier heads are dropped); fill in
# your path.
pretrained = 'checkpoints/CARETrans_S0.pth.tar'
# BatchNorm everywhere in CARE (stem, downsampling, both interaction modules): with few images per
# GPU plain BN statistics are too noisy, so every BN becomes SyncBN in distributed runs.
sync_bn = 'torch'
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='CARE',
        arch='s0',
        # the released network: stage 4 ends with the non-residual 1024-channel expansion that
        # fed the classifier (every checkpoint tensor used); its drop path is disabled
        last_block='expanded',
        drop_path_rate=0.1,   # CARE's ImageNet value (no official downstream value exists)
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[32, 64, 128, 1024], out_channels=256, num_outs=4),
    decode_head=dict(num_classes=150))

train_dataloader = dict(batch_size=4)

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0002, betas=(0.9, 0.999), weight_decay=0.0001),
    clip_grad=None)
param_scheduler = [
    dict(type='PolyLR', power=0.9, eta_min=0.0, begin=0, end=80000, by_epoch=False)
]
train_cfg = dict(val_interval=4000)
default_hooks = dict(checkpoint=dict(interval=4000))
