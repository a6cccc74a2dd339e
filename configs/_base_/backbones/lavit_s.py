# The LaViT-S backbone as the LaViT segmentation configs use it: lavit_t.py (less attention in
# windows of the 224x224 training grid, the diagonality-preserving loss as `loss_diag`, drop path
# 0.1, the four stage outputs) with the small arch. Taken with
# `model = dict(backbone=_base_.pop('backbone'), ...)` (configs/README.md).
_base_ = ['./lavit_t.py']

pretrained = 'checkpoints/lavit_s.pth'  # LaViT has no public weights: your own ImageNet-1k LaViT-S
backbone = dict(arch='small', init_cfg=dict(checkpoint=pretrained))
