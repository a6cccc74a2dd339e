# UperNet with an L2ViT-T backbone, ADE20K 512x512, 160k iterations: the official L2ViT
# segmentation config (semantic_segmentation/configs/novel, mmseg 0.x). Everything but the backbone
# and the optimiser's parameter-wise rules comes from mmseg's Swin UperNet config, which matches the
# official one: AdamW lr 6e-5, betas (0.9, 0.999), weight decay 0.01 (no parameter-wise rules: the
# official line is commented out), linear warm-up over 1500 iterations from 1e-6x, then poly decay
# (power 1.0) to 0 at 160k; 8 GPUs x 2 images; UperNet (PPM 1/2/3/6, 512 channels) + FCN auxiliary
# head on stage 3 (256 channels, weight 0.4); whole-image testing. Data in data/ade/.
_base_ = [
    'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
    '../_base_/backbones/l2vit_t.py',
]

# the heads of the base fit L2ViT-T's widths (Swin-T's, 96-768) and ADE20K's 150 classes
model = dict(backbone=dict(_base_.pop('backbone'), drop_path_rate=0.3))  # official value (T, S, B)

optim_wrapper = dict(paramwise_cfg=dict(_delete_=True))
