# Mask R-CNN + FPN with an L2ViT-T backbone, COCO instance segmentation, 3x schedule
# (36 epochs), recipe of the official L2ViT detection configs: see _base_/l2vit_coco_3x.py.
# Heads are mmdet's Mask R-CNN defaults (as the official mmdet 2.x configs). Data in data/coco/.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/l2vit_coco_3x.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official L2ViT-Tiny ImageNet-1k weights (GitHub release v1.0 of ChuanyangZheng/L2ViT); fill in
# your path. The file keeps the raw weights under 'model' (used, as the official det/seg loader)
# and the EMA under 'model_ema'; the classifier norm/head are dropped and the per-stage output
# norms norm0..norm3 start fresh (reported as missing keys). The official configs never set
# `pretrained` (they would train from scratch): set here on purpose.
pretrained = 'checkpoints/L2ViT-Tiny-checkpoint-best-ema.pth'
# BatchNorm (stem, every LCM) trains as plain BN at 2 images/GPU, as the official configs do; add
# sync_bn = 'torch' to convert it (and the heads' BN) to SyncBN in distributed runs.
model = dict(
    backbone=dict(
        _delete_=True,
        type='L2ViT',
        arch='tiny',
        drop_path_rate=0.2,   # official 3x value for L2ViT-T
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))
train_dataloader = dict(dataset=dict(pipeline={{_base_.l2vit_pipeline_instance}}))
