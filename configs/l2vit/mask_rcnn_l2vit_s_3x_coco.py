# Mask R-CNN + FPN with an L2ViT-S backbone, COCO instance segmentation, 3x schedule: the L2ViT-T
# config (mask_rcnn_l2vit_t_3x_coco.py) with the small arch (same widths as T, deeper).
_base_ = ['./mask_rcnn_l2vit_t_3x_coco.py']

# official L2ViT-Small ImageNet-1k weights (GitHub release v1.0 of ChuanyangZheng/L2ViT)
pretrained = 'checkpoints/L2ViT-Small-checkpoint-best-ema.pth'
model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)))
