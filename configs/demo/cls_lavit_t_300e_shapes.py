# lavit/cls_lavit_t_300e_in1k.py on the class-folder copy of the embedded shapes data (CPU-sized):
# model (the diagonality-preserving loss included), optimiser and weight decay rules unchanged but
# for the 8 classes; the data and schedule overrides of every demo classifier
# (_base_/shapes_cls_demo.py: 64x64 crops, batch 32, 300 iterations, lr 3e-4, no EMA / Mixup /
# CutMix / RandAugment). Trained from scratch.
_base_ = ['../lavit/cls_lavit_t_300e_in1k.py', '../_base_/shapes_cls_demo.py']
_base_.merge(_base_.pop('shapes_cls'))
# LaViT's less-attention maps Θ/Ψ are sized by the windows of pretrain_img_size: at the paper's
# 224 a 64x64 input is padded into one 14x14 window at stage 3 and one 7x7 at stage 4 (12x the
# tokens, 5x the MACs of the whole model: 0.77 vs 0.14 GMAC). Train at the grid you train on; a
# dense config loading this checkpoint sets the same pretrain_img_size (windows of 64x64 pixels).
model = dict(backbone=dict(pretrain_img_size=64))
