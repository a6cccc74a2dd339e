# RetinaNet + FPN with a LaViT-S backbone, COCO, 1x schedule (LaViT paper Table 3: 46.7 AP).
# Same recipe as retinanet_lavit_t_1x_coco.py; only the backbone width/depth differ.
_base_ = ['./retinanet_lavit_t_1x_coco.py']

pretrained = 'checkpoints/lavit_s.pth'  # ImageNet-1k weights of your own LaViT-S
model = dict(
    backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512]))
