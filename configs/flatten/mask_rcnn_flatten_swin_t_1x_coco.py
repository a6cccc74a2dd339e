# Mask R-CNN + FPN with a FLatten-Swin-T backbone, COCO instance segmentation, 1x schedule
# (FLatten paper sec. 5.3, Table 2, which follows Swin's protocol). Recipe in
# _base_/swin_coco_instance_1x.py: AdamW lr 1e-4, weight decay 0.05 (none for norms, relative
# position bias tables and FLA positional encodings), 1000-iteration linear warm-up, 12 epochs with
# steps at 8 and 11, 8 GPUs x 2 images. Data in the standard layout data/coco/.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/swin_coco_instance_1x.py',
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
