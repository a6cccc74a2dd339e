# UperNet with a FLatten-Swin-S backbone, ADE20K 512x512, 160k iterations (FLatten paper sec. 5.2):
# the FLatten-Swin-T recipe with the small arch (drop_path_rate 0.3 as mmseg's Swin-S UperNet).
_base_ = ['./upernet_flatten_swin_t_160k_ade20k.py']

# official FLatten-Swin-S ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_swin_s.pth'
model = dict(backbone=dict(arch='small', drop_path_rate=0.3, init_cfg=dict(checkpoint=pretrained)))
