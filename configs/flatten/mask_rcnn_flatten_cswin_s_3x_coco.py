# Mask R-CNN + FPN with a FLatten-CSWin-S backbone, COCO, 3x schedule (FLatten paper sec. 5.3):
# the FLatten-CSWin-T recipe with the small arch (same widths, deeper) and drop_path_rate 0.4,
# CSWin-S's ImageNet value (FLatten cfg).
_base_ = ['./mask_rcnn_flatten_cswin_t_3x_coco.py']

# official FLatten-CSWin-S ImageNet-1k weights (not released so far); fill in your path
pretrained = 'checkpoints/flatten_cswin_s.pth'
model = dict(backbone=dict(arch='small', drop_path_rate=0.4, init_cfg=dict(checkpoint=pretrained)))
