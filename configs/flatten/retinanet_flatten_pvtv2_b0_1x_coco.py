# RetinaNet + FPN with a FLatten-PVTv2-B0 backbone, COCO detection, 1x schedule: the FLatten-PVT-T
# recipe (retinanet_flatten_pvt_t_1x_coco.py; mmdet's PVTv2 RetinaNet differs from its PVT one only
# in the backbone) with the PVTv2-B0 backbone, which takes the same drop_path_rate and out_indices.
_base_ = ['./retinanet_flatten_pvt_t_1x_coco.py']

# official FLatten-PVTv2-B0 ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_pvt_v2_b0.pth'
model = dict(
    backbone=dict(type='FLattenPVTv2', arch='b0', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[32, 64, 160, 256]))
