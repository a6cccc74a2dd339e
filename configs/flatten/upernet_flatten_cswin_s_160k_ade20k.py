# UperNet with a FLatten-CSWin-S backbone, ADE20K 512x512, 160k iterations (FLatten paper
# sec. 5.2): the FLatten-CSWin-T recipe with the small arch and drop_path_rate 0.4, CSWin-S's
# ImageNet value (FLatten cfg).
_base_ = ['./upernet_flatten_cswin_t_160k_ade20k.py']

# official FLatten-CSWin-S ImageNet-1k weights (not released so far); fill in your path
pretrained = 'checkpoints/flatten_cswin_s.pth'
model = dict(backbone=dict(arch='small', drop_path_rate=0.4, init_cfg=dict(checkpoint=pretrained)))
