# Semantic FPN on ADE20K 512x512, 80k iterations, with the recipe of PVT's segmentation experiments
# (which FLatten-PVT and LaViT follow): mmseg's FPN head on the four backbone stages (256 channels,
# 150 classes), AdamW lr 1e-4, betas (0.9, 0.999), weight decay 1e-4, no gradient clipping, poly
# decay with power 0.9 to 0 at 80k, batch 16 (4 GPUs x 4 images); data, 512x512 crops and the
# runtime from mmseg's bases, data in data/ade/ADEChallengeData2016/. The inheriting config sets the
# backbone (with `_delete_=True`: the base's is a ResNet) and the neck's in_channels.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
]

crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    neck=dict(out_channels=256, num_outs=4),
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
