# The L2ViT-T backbone as the L2ViT configs use it: the four stage outputs (the RetinaNet configs
# take stages 2-4), drop path 0.1 (official 1x detection value for T and S; B 0.2; 3x 0.2 / 0.3;
# segmentation 0.3), initialised from the official ImageNet-1k weights. A config takes it with
# `model = dict(backbone=_base_.pop('backbone'), ...)`, which also drops this helper key from the
# config (configs/README.md); `_delete_` replaces the base model's ResNet.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official L2ViT-Tiny ImageNet-1k weights (GitHub release v1.0 of ChuanyangZheng/L2ViT); fill in
# your path. The file keeps the raw weights under 'model' (used, as the official det/seg loader)
# and the EMA under 'model_ema'; the classifier norm/head are dropped and the per-stage output
# norms norm0..norm3 start fresh (reported as missing keys). The official configs never set
# `pretrained` (they would train from scratch): set here on purpose.
pretrained = 'checkpoints/L2ViT-Tiny-checkpoint-best-ema.pth'
# BatchNorm (stem, every LCM) trains as plain BN at 2 images/GPU, as the official configs do; add
# sync_bn = 'torch' to convert it (and the heads' BN) to SyncBN in distributed runs.
backbone = dict(
    _delete_=True,
    type='L2ViT',
    arch='tiny',
    drop_path_rate=0.1,
    out_indices=(0, 1, 2, 3),
    init_cfg=dict(type='Pretrained', checkpoint=pretrained))
