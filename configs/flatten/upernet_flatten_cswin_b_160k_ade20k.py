# UperNet with a FLatten-CSWin-B backbone, ADE20K 512x512, 160k iterations (FLatten paper
# sec. 5.2): the FLatten-CSWin-T recipe with the base arch (stage-1 width 96) and drop_path_rate
# 0.5, CSWin-B's ImageNet value (FLatten cfg).
_base_ = ['./upernet_flatten_cswin_t_160k_ade20k.py']

# official FLatten-CSWin-B ImageNet-1k weights (not released so far); fill in your path
pretrained = 'checkpoints/flatten_cswin_b.pth'
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.5, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
