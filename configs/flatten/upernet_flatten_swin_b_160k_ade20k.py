# UperNet with a FLatten-Swin-B backbone, ADE20K 512x512, 160k iterations (FLatten paper sec. 5.2):
# the FLatten-Swin-T recipe with the base arch (drop_path_rate 0.3 as mmseg's Swin-B UperNet).
_base_ = ['./upernet_flatten_swin_t_160k_ade20k.py']

# official FLatten-Swin-B (224) ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_swin_b.pth'
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.3, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512))
