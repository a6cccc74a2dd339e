# Mask R-CNN + FPN with a FLatten-Swin-T backbone, COCO instance segmentation, 3x schedule with
# Swin's multi-scale + random-crop training (FLatten paper sec. 5.3, Table 2). Recipe in
# _base_/swin_coco_instance_ms_crop_3x.py: as the 1x recipe, 36 epochs with steps at 27 and 33.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/swin_coco_instance_ms_crop_3x.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official FLatten-Swin-T ImageNet-1k weights (FLatten-Transformer release); fill in your path.
# They hold no per-stage out-norms norm0..norm3: those are reported as missing keys (expected).
pretrained = 'checkpoints/flatten_swin_t.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='FLattenSwin',
        arch='tiny',
        attn_type='LLSS',     # FLA over the whole map in stages 1-2, 7x7 shifted windows in 3-4
        window_size=7,
        drop_path_rate=0.2,   # mmdet's / Swin's detection value for T
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))
