# Cascade Mask R-CNN + FPN with the Swin paper's box heads (the detection recipe FLatten-Swin and
# the Focal Transformer follow; mmdet's convnext cascade configs reproduce it): each of the three
# box heads is 4 shared 3x3 convs with SyncBN + 1 fc ("4conv1fc"), class-specific regression on
# decoded boxes with a GIoU loss (weight 10). SyncBN is plain BatchNorm in single-process runs.
# The backbone and the neck's in_channels are set by the inheriting config.
_base_ = ['mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py']


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


model = dict(roi_head=dict(bbox_head=[
    _box_head([0.1, 0.1, 0.2, 0.2]),
    _box_head([0.05, 0.05, 0.1, 0.1]),
    _box_head([0.033, 0.033, 0.067, 0.067]),
]))
