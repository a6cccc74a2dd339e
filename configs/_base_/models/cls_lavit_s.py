# LaViT-S as an ImageNet-1k classifier: LaViT-T's classifier (cls_lavit_t.py) on the small arch
# (PVT-S depths 3-4-6-3, stage-4 width 512). Drop path 0.1 (PVT-S's).
_base_ = ['./cls_lavit_t.py']

model = dict(backbone=dict(arch='small', drop_path_rate=0.1), head=dict(in_channels=512))
