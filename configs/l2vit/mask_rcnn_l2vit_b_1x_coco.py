# Mask R-CNN + FPN with an L2ViT-B backbone, COCO instance segmentation, 1x schedule: the L2ViT-T
# config (mask_rcnn_l2vit_t_1x_coco.py) with the base arch and the official drop path for B.
_base_ = ['./mask_rcnn_l2vit_t_1x_coco.py']

# official L2ViT-Base ImageNet-1k weights (GitHub release v1.0 of ChuanyangZheng/L2ViT)
pretrained = 'checkpoints/L2ViT-Base-checkpoint-best-ema.pth'
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.2, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[128, 256, 512, 1024]))
