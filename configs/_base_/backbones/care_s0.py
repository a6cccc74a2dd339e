# The CARE-S0 backbone as the CARE configs use it: the released network, the four stage outputs
# for the neck, drop path 0.1, every BatchNorm synchronised in distributed runs, initialised from
# the official ImageNet-1k weights. A config takes it with
# `model = dict(backbone=_base_.pop('backbone'), ...)`, which also drops this helper key from the
# config (configs/README.md); `_delete_` replaces the base model's ResNet.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official CARE-S0 ImageNet-1k weights (CARETrans_S0.pth.tar, Google Drive folder of
# zhouyuan888888/CARE-Transformer; a raw state dict, the two classifier heads are dropped); fill in
# your path.
pretrained = 'checkpoints/CARETrans_S0.pth.tar'
# BatchNorm everywhere in CARE (stem, downsampling, both interaction modules): with few images per
# GPU plain BN statistics are too noisy, so every BN becomes SyncBN in distributed runs.
sync_bn = 'torch'
backbone = dict(
    _delete_=True,
    type='CARE',
    arch='s0',
    # the released network: stage 4 ends with the non-residual 1024-channel expansion (1536 in
    # S2) that fed the classifier (every checkpoint tensor used); its drop path is disabled
    last_block='expanded',
    drop_path_rate=0.1,   # CARE's ImageNet value (no official downstream value exists)
    out_indices=(0, 1, 2, 3),
    init_cfg=dict(type='Pretrained', checkpoint=pretrained))
