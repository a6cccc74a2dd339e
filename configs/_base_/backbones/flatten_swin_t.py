# The FLatten-Swin-T backbone as every FLatten-Swin config uses it (FLatten paper sec. 5.2-5.3):
# focused linear attention over the whole map in stages 1-2, 7x7 shifted windows in stages 3-4, the
# four stage outputs for the neck, initialised from the official ImageNet-1k weights. A config
# takes it with `model = dict(backbone=_base_.pop('backbone'), ...)`, which also drops this helper
# key from the config (configs/README.md); `_delete_` replaces the base model's ResNet.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official FLatten-Swin-T ImageNet-1k weights (FLatten-Transformer release); fill in your path.
# They hold no per-stage out-norms norm0..norm3: those are reported as missing keys (expected).
pretrained = 'checkpoints/flatten_swin_t.pth'
backbone = dict(
    _delete_=True,
    type='FLattenSwin',
    arch='tiny',
    attn_type='LLSS',
    window_size=7,
    drop_path_rate=0.2,   # mmdet's / Swin's detection value for T (mmseg's Swin UperNet: 0.3)
    out_indices=(0, 1, 2, 3),
    init_cfg=dict(type='Pretrained', checkpoint=pretrained))
