# Mask R-CNN + FPN with a FLatten-PVTv2-B2 backbone, COCO instance segmentation, 1x schedule
# (recipe of mask_rcnn_flatten_pvtv2_b0_1x_coco.py).
_base_ = ['./mask_rcnn_flatten_pvtv2_b0_1x_coco.py']

# FLatten-PVTv2-B2 ImageNet-1k weights (not released by FLatten; train or convert your own)
pretrained = 'checkpoints/flatten_pvt_v2_b2.pth'
model = dict(
    backbone=dict(arch='b2', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512]))
