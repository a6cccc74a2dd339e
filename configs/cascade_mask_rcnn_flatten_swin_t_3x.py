# Cascade Mask R-CNN + FPN with a FLatten-Swin-T backbone, COCO, 3x schedule with Swin's
# multi-scale + random-crop training (FLatten paper sec. 5.3, Table 2). Heads as in the Swin paper's
# Cascade Mask R-CNN (and mmdet's convnext cascade configs that reproduce it): each of the three box
# heads is 4 shared 3x3 convs with SyncBN + 1 fc ("4conv1fc"), class-specific regression on
# decoded boxes with a GIoU loss (weight 10). SyncBN is plain BatchNorm in single-process runs.
# Recipe in _base_/swin_coco_instance_ms_crop_3x.py (AdamW lr 1e-4, weight decay 0.05, 36 epochs,
# steps at 27 and 33, 8 GPUs x 2 images).
_base_ = [
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py',
    './_base_/swin_coco_instance_ms_crop_3x.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official FLatten-Swin-T ImageNet-1k weights (FLatten-Transformer release); fill in your path.
# They hold no per-stage out-norms norm0..norm3: those are reported as missing keys (expected).
pretrained = 'checkpoints/flatten_swin_t.pth'


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
        type='FLattenSwin',
        arch='tiny',
        attn_type='LLSS',     # FLA over the whole map in stages 1-2, 7x7 shifted windows in 3-4
        window_size=7,
        drop_path_rate=0.2,   # Swin's cascade detection value for T
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]),
    roi_head=dict(bbox_head=[
        _box_head([0.1, 0.1, 0.2, 0.2]),
        _box_head([0.05, 0.05, 0.1, 0.1]),
        _box_head([0.033, 0.033, 0.067, 0.067]),
    ]))
