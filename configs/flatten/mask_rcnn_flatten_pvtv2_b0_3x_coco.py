# Mask R-CNN + FPN with a FLatten-PVTv2-B0 backbone, COCO instance segmentation, 3x multi-scale
# schedule: the FLatten-PVT-T 3x recipe (mask_rcnn_flatten_pvt_t_3x_coco.py, the PVT / PVT v2
# protocol) with the PVTv2-B0 backbone; FLattenPVTv2 takes the same drop_path_rate and out_indices.
_base_ = ['./mask_rcnn_flatten_pvt_t_3x_coco.py']

# official FLatten-PVTv2-B0 ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_pvt_v2_b0.pth'
model = dict(
    backbone=dict(type='FLattenPVTv2', arch='b0', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[32, 64, 160, 256]))
