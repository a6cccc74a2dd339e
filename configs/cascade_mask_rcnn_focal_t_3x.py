# Cascade Mask R-CNN + FPN with a Focal-T backbone, COCO, 3x schedule with Swin's multi-scale +
# random-crop training (official README: 51.5 box AP, 87M parameters). Heads as in the Swin
# paper's Cascade Mask R-CNN (which the authors say they follow): each of the three box heads is
# 4 shared 3x3 convs with SyncBN + 1 fc ("4conv1fc"), class-specific regression on decoded boxes
# with a GIoU loss (weight 10); SyncBN is plain BatchNorm in single-process runs. Recipe in
# _base_/swin_coco_instance_ms_crop_3x.py (AdamW lr 1e-4, weight decay 0.05, 36 epochs, steps at
# 27 and 33, 8 GPUs x 2 images).
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    './_base_/swin_coco_instance_ms_crop_3x.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official Focal-T ImageNet-1k weights (see mask_rcnn_focal_t_1x.py for the expected missing keys)
pretrained = 'checkpoints/focal-tiny-is224-ws7.pth'


def _box_head(stds):
    return dict(
        type='ConvFCBBoxHead',
        num_shared_convs=4,
        num_shared_fcs=1,
        in_channels=256,
        conv_out_channels=256,
        fc_out_channels=1024,
        roi_feat_size=7,
        num_classes=80,
        bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                        target_stds=stds),
        reg_class_agnostic=False,
        reg_decoded_bbox=True,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
        loss_bbox=dict(type='GIoULoss', loss_weight=10.0))


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
    neck=dict(in_channels=[96, 192, 384, 768]),
    roi_head=dict(bbox_head=[
        _box_head([0.1, 0.1, 0.2, 0.2]),
        _box_head([0.05, 0.05, 0.1, 0.1]),
        _box_head([0.033, 0.033, 0.067, 0.067]),
    ]))
