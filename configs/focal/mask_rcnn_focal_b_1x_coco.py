# Mask R-CNN + FPN with a Focal-B backbone, COCO, 1x schedule (official README:
# 47.8 / 43.2 box / mask AP, 110M parameters). Everything but the backbone as
# mask_rcnn_focal_t_1x_coco.py.
_base_ = ['./mask_rcnn_focal_t_1x_coco.py']

# official Focal-B ImageNet-1k weights (focal-base-is224-ws7.pth); fill in your path
pretrained = 'checkpoints/focal-base-is224-ws7.pth'
# drop_path_rate: ImageNet value for B (the authors' detection value is unpublished)
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.5, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[128, 256, 512, 1024]))
