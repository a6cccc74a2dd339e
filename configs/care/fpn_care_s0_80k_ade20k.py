# Semantic FPN with a CARE-S0 backbone, ADE20K 512x512, 80k iterations. CARE publishes no
# segmentation code or config; this is the Semantic FPN protocol of the mobile backbones CARE
# compares with (EfficientFormerV2, MobileViGv2; care.md sec. 10): PVT's recipe
# (_base_/semantic_fpn_ade20k_80k.py: weight decay 1e-4, poly decay with power 0.9 to 0, 512x512
# crops from 2048x512 rescales with ratio 0.5-2.0) with AdamW lr 2e-4, 8 GPUs x 4 images, and
# evaluation/checkpoints every 4k iterations. Data in data/ade/.
_base_ = [
    '../_base_/semantic_fpn_ade20k_80k.py',
    '../_base_/backbones/care_s0.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[32, 64, 128, 1024]))

optim_wrapper = dict(optimizer=dict(lr=0.0002))
train_cfg = dict(val_interval=4000)
default_hooks = dict(checkpoint=dict(interval=4000))
