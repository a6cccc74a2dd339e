# Mask R-CNN + FPN with an L2ViT-T backbone, COCO instance segmentation, 1x schedule
# (12 epochs), recipe of the official L2ViT detection configs: see _base_/l2vit_coco_1x.py.
# Heads are mmdet's Mask R-CNN defaults (as the official mmdet 2.x configs). Data in data/coco/.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/l2vit_coco_1x.py',
    '../_base_/backbones/l2vit_t.py',
]

model = dict(backbone=_base_.pop('backbone'), neck=dict(in_channels=[96, 192, 384, 768]))
train_dataloader = dict(dataset=dict(pipeline={{_base_.l2vit_pipeline_instance}}))
