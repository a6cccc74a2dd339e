# RetinaNet + FPN with a Focal-B backbone, COCO detection, 3x schedule (official README: 46.9 AP,
# 101M parameters). Everything but the backbone as retinanet_focal_t_3x_coco.py.
_base_ = ['./retinanet_focal_t_3x_coco.py']

# official Focal-B ImageNet-1k weights (focal-base-is224-ws7.pth); fill in your path
pretrained = 'checkpoints/focal-base-is224-ws7.pth'
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.5, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[256, 512, 1024]))
