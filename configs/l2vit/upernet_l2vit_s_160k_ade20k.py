# UperNet with an L2ViT-S backbone, ADE20K 512x512, 160k iterations: the L2ViT-T config
# (upernet_l2vit_t_160k_ade20k.py) with the small arch (same widths as T, deeper).
_base_ = ['./upernet_l2vit_t_160k_ade20k.py']

# official L2ViT-Small ImageNet-1k weights (GitHub release v1.0 of ChuanyangZheng/L2ViT)
pretrained = 'checkpoints/L2ViT-Small-checkpoint-best-ema.pth'
model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)))
