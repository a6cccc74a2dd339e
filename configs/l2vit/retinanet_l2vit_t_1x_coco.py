# RetinaNet + FPN with an L2ViT-T backbone, COCO detection, 1x schedule (12 epochs), recipe of the
# official L2ViT detection configs: see _base_/l2vit_coco_1x.py. As the official configs, stages 2-4
# feed the FPN (start_level 0, extra convs on the input, 5 levels). Data in data/coco/.
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    '../_base_/l2vit_coco_1x.py',
    '../_base_/backbones/l2vit_t.py',
]

model = dict(
    backbone=dict(_base_.pop('backbone'), out_indices=(1, 2, 3)),
    neck=dict(in_channels=[192, 384, 768], start_level=0, add_extra_convs='on_input', num_outs=5))
train_dataloader = dict(dataset=dict(pipeline={{_base_.l2vit_pipeline_box}}))
