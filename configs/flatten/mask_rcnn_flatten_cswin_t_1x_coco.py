# Mask R-CNN + FPN with a FLatten-CSWin-T backbone, COCO instance segmentation, 1x schedule
# (FLatten paper sec. 5.3; CSWin's detection protocol is Swin's). Recipe in
# _base_/swin_coco_instance_1x.py: AdamW lr 1e-4, weight decay 0.05 (none for norms and FLA
# positional encodings), 1000-iteration linear warm-up, 12 epochs with steps at 8 and 11,
# 8 GPUs x 2 images. Data in the standard layout data/coco/.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/swin_coco_instance_1x.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official FLatten-CSWin-T ImageNet-1k weights (FLatten-Transformer release); fill in your path.
# They hold no per-stage out-norms norm0..norm3: those are reported as missing keys (expected).
pretrained = 'checkpoints/flatten_cswin_t.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='FLattenCSWin',
        arch='tiny',
        attn_types='LLSS',    # FLA + LePE over the whole map in stages 1-2, CSWin stripes in 3-4
        drop_path_rate=0.2,   # CSWin-T's ImageNet value (FLatten cfg); S 0.4, B 0.5
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 256, 512]))

# the stem LayerNorm keeps its official name stage1_conv_embed.2, which 'norm' does not match
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'stage1_conv_embed.2': dict(decay_mult=0.)}))
