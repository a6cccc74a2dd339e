# UperNet with a Focal-S backbone, ADE20K 512x512, 160k iterations (official README: 48.0 mIoU,
# 50.0 multi-scale; 85M parameters). Everything but the backbone as upernet_focal_t_160k_ade20k.py.
_base_ = ['./upernet_focal_t_160k_ade20k.py']

# official Focal-S ImageNet-1k weights (focal-small-is224-ws7.pth); fill in your path
pretrained = 'checkpoints/focal-small-is224-ws7.pth'
model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)))
