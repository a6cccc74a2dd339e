# The FLatten-CSWin-T backbone as every FLatten-CSWin config uses it (FLatten paper sec. 5.2-5.3;
# CSWin's downstream protocol is Swin's): focused linear attention + LePE over the whole map in
# stages 1-2, CSWin's cross-shaped stripes in stages 3-4, the four stage outputs for the neck,
# initialised from the official ImageNet-1k weights. A config takes it with
# `model = dict(backbone=_base_.pop('backbone'), ...)`, which also drops this helper key from the
# config (configs/README.md); `_delete_` replaces the base model's ResNet.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official FLatten-CSWin-T ImageNet-1k weights (FLatten-Transformer release); fill in your path.
# They hold no per-stage out-norms norm0..norm3: those are reported as missing keys (expected).
pretrained = 'checkpoints/flatten_cswin_t.pth'
backbone = dict(
    _delete_=True,
    type='FLattenCSWin',
    arch='tiny',
    attn_types='LLSS',
    drop_path_rate=0.2,   # CSWin-T's ImageNet value (FLatten cfg); S 0.4, B 0.5
    out_indices=(0, 1, 2, 3),
    init_cfg=dict(type='Pretrained', checkpoint=pretrained))
