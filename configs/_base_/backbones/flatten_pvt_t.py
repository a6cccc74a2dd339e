# The FLatten-PVT-T backbone as every FLatten-PVT config uses it: the four stage outputs for the
# neck, drop path 0.1 (the classification recipe's), initialised from the official ImageNet-1k
# weights. A config takes it with `model = dict(backbone=_base_.pop('backbone'), ...)`, which also
# drops this helper key from the config (configs/README.md); `_delete_` replaces the base model's
# ResNet.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official FLatten-PVT-T ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_pvt_t.pth'
backbone = dict(
    _delete_=True,
    type='FLattenPVT',
    arch='tiny',
    drop_path_rate=0.1,
    out_indices=(0, 1, 2, 3),
    init_cfg=dict(type='Pretrained', checkpoint=pretrained))
