# Mask R-CNN + FPN with a Focal-T backbone, COCO instance segmentation, 1x schedule (Focal
# Transformer paper sec. 4.2 / official README: 44.8 box AP, 41.0 mask AP; 49M parameters).
# The authors' detection code was never released; their README says the pipeline follows Swin's
# (Swin-Transformer-Object-Detection), so the recipe is Swin's, in _base_/swin_coco_instance_1x.py:
# AdamW lr 1e-4, weight decay 0.05 (none for norms and the three relative position bias tables:
# 'relative_position_bias_table' matches ..._to_neighbors and ..._to_windows by substring),
# 1000-iteration linear warm-up, 12 epochs with steps at 8 and 11, 8 GPUs x 2 images.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/swin_coco_instance_1x.py',
    '../_base_/backbones/focal_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[96, 192, 384, 768]))
