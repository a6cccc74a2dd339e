# UperNet with an L2ViT-S backbone, ADE20K 512x512, 160k iterations: the official L2ViT
# segmentation config (semantic_segmentation/configs/novel, mmseg 0.x). Everything but the backbone
# and the optimiser's parameter-wise rules comes from mmseg's Swin UperNet config, which matches the
# official one: AdamW lr 6e-5, betas (0.9, 0.999), weight decay 0.01 (no parameter-wise rules: the
# official line is commented out), linear warm-up over 1500 iterations from 1e-6x, then poly decay
# (power 1.0) to 0 at 160k; 8 GPUs x 2 images; UperNet (PPM 1/2/3/6, 512 channels) + FCN auxiliary
# head on stage 3 (256 channels, weight 0.4); whole-image testing. Data in data/ade/.
_base_ = ['mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py']
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official L2ViT-Small ImageNet-1k weights (GitHub release v1.0 of ChuanyangZheng/L2ViT); fill in
# your path. The file keeps the raw weights under 'model' (used, as the official det/seg loader)
# and the EMA under 'model_ema'; the classifier norm/head are dropped and the per-stage output
# norms norm0..norm3 start fresh (reported as missing keys). The official configs never set
# `pretrained` (they would train from scratch): set here on purpose.
pretrained = 'checkpoints/L2ViT-Small-checkpoint-best-ema.pth'
# BatchNorm (stem, every LCM) trains as plain BN at 2 images/GPU, as the official configs do; add
# sync_bn = 'torch' to convert it (and the heads' BN) to SyncBN in distributed runs.
model = dict(
    backbone=dict(
        _delete_=True,
        type='L2ViT',
        arch='small',
        drop_path_rate=0.3,   # official value (T, S and B)
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 384, 768], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150))

optim_wrapper = dict(paramwise_cfg=dict(_delete_=True))
