# LaViT-S trained from scratch on ImageNet-1k (82.6 top-1 as reported by a third party): the
# recipe of cls_lavit_t_300e_in1k.py (PVT's: batch 1024, AdamW lr 1e-3, warm-up 5 epochs, cosine,
# 300 epochs, drop path 0.1, no decay on the position embeddings) on the small arch, as
# _base_/models/cls_lavit_s.py builds it (PVT-S depths 3-4-6-3, stage-4 width 512).
_base_ = ['./cls_lavit_t_300e_in1k.py']

model = dict(backbone=dict(arch='small', drop_path_rate=0.1), head=dict(in_channels=512))
