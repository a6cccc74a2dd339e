# Cascade Mask R-CNN + FPN with a FLatten-Swin-T backbone, COCO, 3x schedule with Swin's
# multi-scale + random-crop training (FLatten paper sec. 5.3, Table 2). Heads as in the Swin paper's
# Cascade Mask R-CNN (_base_/cascade_mask_rcnn_4conv1fc_giou.py): each of the three box
# heads is 4 shared 3x3 convs with SyncBN + 1 fc ("4conv1fc"), class-specific regression on
# decoded boxes with a GIoU loss (weight 10). SyncBN is plain BatchNorm in single-process runs.
# Recipe in _base_/swin_coco_instance_ms_crop_3x.py (AdamW lr 1e-4, weight decay 0.05, 36 epochs,
# steps at 27 and 33, 8 GPUs x 2 images).
_base_ = [
    '../_base_/cascade_mask_rcnn_4conv1fc_giou.py',
    '../_base_/swin_coco_instance_ms_crop_3x.py',
    '../_base_/backbones/flatten_swin_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[96, 192, 384, 768]))
