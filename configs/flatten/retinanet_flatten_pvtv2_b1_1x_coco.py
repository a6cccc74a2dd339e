# RetinaNet + FPN with a FLatten-PVTv2-B1 backbone, COCO detection, 1x schedule (recipe of
# retinanet_flatten_pvtv2_b0_1x_coco.py: AdamW lr 1e-4, weight decay 1e-4).
_base_ = ['./retinanet_flatten_pvtv2_b0_1x_coco.py']

# FLatten-PVTv2-B1 ImageNet-1k weights (not released by FLatten; train or convert your own)
pretrained = 'checkpoints/flatten_pvt_v2_b1.pth'
model = dict(
    backbone=dict(arch='b1', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512]))
