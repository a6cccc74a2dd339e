# UperNet with an L2ViT-B backbone, ADE20K 512x512, 160k iterations: the L2ViT-T config
# (upernet_l2vit_t_160k_ade20k.py) with the base arch (official drop path 0.3 for T, S and B).
_base_ = ['./upernet_l2vit_t_160k_ade20k.py']

# official L2ViT-Base ImageNet-1k weights (GitHub release v1.0 of ChuanyangZheng/L2ViT)
pretrained = 'checkpoints/L2ViT-Base-checkpoint-best-ema.pth'
model = dict(
    backbone=dict(arch='base', init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512))
