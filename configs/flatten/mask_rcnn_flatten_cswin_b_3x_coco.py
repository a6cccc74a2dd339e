# Mask R-CNN + FPN with a FLatten-CSWin-B backbone, COCO, 3x schedule (FLatten paper sec. 5.3):
# the FLatten-CSWin-T recipe with the base arch (stage-1 width 96) and drop_path_rate 0.5,
# CSWin-B's ImageNet value (FLatten cfg).
_base_ = ['./mask_rcnn_flatten_cswin_t_3x_coco.py']

# official FLatten-CSWin-B ImageNet-1k weights (not released so far); fill in your path
pretrained = 'checkpoints/flatten_cswin_b.pth'
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.5, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))
