# Mask R-CNN + FPN with a Focal-S backbone, COCO, 1x schedule (official README:
# 47.4 / 42.8 box / mask AP, 71M parameters). Everything but the backbone as
# mask_rcnn_focal_t_1x_coco.py.
_base_ = ['./mask_rcnn_focal_t_1x_coco.py']

# official Focal-S ImageNet-1k weights (focal-small-is224-ws7.pth); fill in your path
pretrained = 'checkpoints/focal-small-is224-ws7.pth'
# drop_path_rate: ImageNet value for S (the authors' detection value is unpublished)
model = dict(backbone=dict(arch='small', drop_path_rate=0.3, init_cfg=dict(checkpoint=pretrained)))
