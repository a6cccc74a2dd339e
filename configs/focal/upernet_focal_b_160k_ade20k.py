# UperNet with a Focal-B backbone, ADE20K 512x512, 160k iterations (official README: 49.0 mIoU,
# 50.5 multi-scale; 126M parameters). Everything but the backbone as upernet_focal_t_160k_ade20k.py.
_base_ = ['./upernet_focal_t_160k_ade20k.py']

# official Focal-B ImageNet-1k weights (focal-base-is224-ws7.pth); fill in your path
pretrained = 'checkpoints/focal-base-is224-ws7.pth'
model = dict(
    backbone=dict(arch='base', init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512))
