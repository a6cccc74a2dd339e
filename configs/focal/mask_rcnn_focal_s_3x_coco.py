# Mask R-CNN + FPN with a Focal-S backbone, COCO, 3x schedule (official README:
# 48.8 / 43.8 box / mask AP, 71M parameters). Everything but the backbone as
# mask_rcnn_focal_t_3x.py.
_base_ = ['./mask_rcnn_focal_t_3x_coco.py']

# official Focal-S ImageNet-1k weights (focal-small-is224-ws7.pth); fill in your path
pretrained = 'checkpoints/focal-small-is224-ws7.pth'
model = dict(
    backbone=dict(
        arch='small',
        drop_path_rate=0.3,  # ImageNet value for S (detection value unpublished)
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)))
