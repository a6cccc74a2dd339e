# Cascade Mask R-CNN + FPN with a FLatten-Swin-T backbone, COCO, 3x schedule with Swin's
# multi-scale + random-crop training (FLatten paper sec. 5.3, Table 2). Heads as in the Swin paper's
# Cascade Mask R-CNN (_base_/cascade_mask_rcnn_4conv1fc_giou.py): each of the three box
# heads is 4 shared 3x3 convs with SyncBN + 1 fc ("4conv1fc"), class-specific regression on
# decoded boxes with a GIoU loss (weight 10). SyncBN is plain BatchNorm in single-process runs.
# Recipe in _base_/swin_coco_instance_ms_crop_3x.py (AdamW lr 1e-4, weight decay 0.05, 36 epochs,
# steps at 27 and 33, 8 GPUs x 2 images).
_base_ = [
    '../_base_/cascade_mask_rcnn_4conv1fc_giou.py',
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
        drop_path_rate=0.2,   # Swin's cascade detection value for T
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))
