# RetinaNet + FPN with a Focal-S backbone, COCO detection, 1x schedule (official README: 45.6 AP,
# 62M parameters). Everything but the backbone as retinanet_focal_t_1x_coco.py.
_base_ = ['./retinanet_focal_t_1x_coco.py']

# official Focal-S ImageNet-1k weights (focal-small-is224-ws7.pth); fill in your path
pretrained = 'checkpoints/focal-small-is224-ws7.pth'
model = dict(backbone=dict(arch='small', drop_path_rate=0.3, init_cfg=dict(checkpoint=pretrained)))
