# Mask R-CNN + FPN with a FLatten-Swin-T backbone, COCO instance segmentation, 1x schedule
# (FLatten paper sec. 5.3, Table 2, which follows Swin's protocol). Recipe in
# _base_/swin_coco_instance_1x.py: AdamW lr 1e-4, weight decay 0.05 (none for norms, relative
# position bias tables and FLA positional encodings), 1000-iteration linear warm-up, 12 epochs with
# steps at 8 and 11, 8 GPUs x 2 images. Data in the standard layout data/coco/.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/swin_coco_instance_1x.py',
    '../_base_/backbones/flatten_swin_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[96, 192, 384, 768]))
