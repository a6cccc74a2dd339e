# Mask R-CNN + FPN with a Focal-B backbone, COCO, 3x schedule (official README:
# 49.0 / 43.7 box / mask AP, 110M parameters). Everything but the backbone as
# mask_rcnn_focal_t_3x.py.
_base_ = ['./mask_rcnn_focal_t_3x_coco.py']

# official Focal-B ImageNet-1k weights (focal-base-is224-ws7.pth); fill in your path
pretrained = 'checkpoints/focal-base-is224-ws7.pth'
model = dict(
    backbone=dict(
        arch='base',
        drop_path_rate=0.5,  # ImageNet value for B (detection value unpublished)
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[128, 256, 512, 1024]))
