# Mask R-CNN + FPN with a FLatten-PVTv2-B0 backbone, COCO instance segmentation, 1x schedule: the
# FLatten-PVT-T recipe (mask_rcnn_flatten_pvt_t_1x_coco.py, PVT's detection protocol, which PVTv2
# keeps) with the PVTv2-B0 backbone; FLattenPVTv2 takes the same drop_path_rate and out_indices.
_base_ = ['./mask_rcnn_flatten_pvt_t_1x_coco.py']

# official FLatten-PVTv2-B0 ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_pvt_v2_b0.pth'
model = dict(
    backbone=dict(type='FLattenPVTv2', arch='b0', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[32, 64, 160, 256]))
