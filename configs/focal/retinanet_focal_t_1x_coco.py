# RetinaNet + FPN with a Focal-T backbone, COCO detection, 1x schedule (official README: 43.7 AP,
# 39M parameters). Detection code was never released; the README says the pipeline follows Swin's,
# so the optimiser is Swin's detection recipe: AdamW lr 1e-4, betas (0.9, 0.999), weight decay
# 0.05 (none for norms and the relative position bias tables), 1000-iteration linear warm-up,
# 12 epochs with steps at 8 and 11, single-scale 1333x800 training, 8 GPUs x 2 images. As mmdet's
# Swin RetinaNet, stages 2-4 feed the FPN (start level 0, extra convs on the input, 5 levels).
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    '../_base_/swin_det_schedule_1x.py',
    '../_base_/backbones/focal_t.py',
]

model = dict(
    backbone=dict(_base_.pop('backbone'), out_indices=(1, 2, 3)),
    neck=dict(in_channels=[192, 384, 768], start_level=0, add_extra_convs='on_input', num_outs=5))
