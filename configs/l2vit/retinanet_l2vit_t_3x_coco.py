# RetinaNet + FPN with an L2ViT-T backbone, COCO detection, 3x schedule: the official 3x
# recipe (_base_/l2vit_coco_3x.py: the 1x data and optimiser, 36 epochs with lr x0.1 after epochs
# 27 and 33) with the official 3x drop path (0.2 for T and S, 0.3 for B); otherwise as
# retinanet_l2vit_t_1x_coco.py, with the same backbone base.
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    '../_base_/l2vit_coco_3x.py',
    '../_base_/backbones/l2vit_t.py',
]

model = dict(
    backbone=dict(_base_.pop('backbone'), out_indices=(1, 2, 3), drop_path_rate=0.2),
    neck=dict(in_channels=[192, 384, 768], start_level=0, add_extra_convs='on_input', num_outs=5))
train_dataloader = dict(dataset=dict(pipeline={{_base_.l2vit_pipeline_box}}))
