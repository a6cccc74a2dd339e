# Mask R-CNN + FPN with a Focal-T backbone, COCO, 3x schedule with Swin's multi-scale + random-crop
# training (official README: 47.2 box AP, 42.7 mask AP). Recipe in
# _base_/swin_coco_instance_ms_crop_3x.py (as the 1x recipe, 36 epochs, steps at 27 and 33); the
# backbone as in mask_rcnn_focal_t_1x.py.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/swin_coco_instance_ms_crop_3x.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official Focal-T ImageNet-1k weights (see mask_rcnn_focal_t_1x.py for the expected missing keys)
pretrained = 'checkpoints/focal-tiny-is224-ws7.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='FocalTransformer',
        arch='tiny',
        use_conv_embed=False,
        mask_borders=True,
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))
