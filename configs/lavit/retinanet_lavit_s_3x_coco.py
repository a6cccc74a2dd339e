# RetinaNet + FPN with a LaViT-S backbone, COCO, 3x multi-scale schedule (LaViT paper Table 3:
# 48.9 AP). Same recipe as retinanet_lavit_t_3x_coco.py; only the backbone differs.
_base_ = ['./retinanet_lavit_t_3x_coco.py']

pretrained = 'checkpoints/lavit_s.pth'  # ImageNet-1k weights of your own LaViT-S
model = dict(
    backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512]))
