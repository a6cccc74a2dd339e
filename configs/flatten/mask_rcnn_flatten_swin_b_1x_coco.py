# Mask R-CNN + FPN with a FLatten-Swin-B backbone, COCO, 1x schedule (FLatten paper sec. 5.3):
# the FLatten-Swin-T recipe with the base arch. drop_path_rate 0.3: mmdet ships no Swin-B detector,
# Swin's own Swin-B detection configs use 0.3.
_base_ = ['./mask_rcnn_flatten_swin_t_1x_coco.py']

# official FLatten-Swin-B (224) ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_swin_b.pth'
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.3, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[128, 256, 512, 1024]))
