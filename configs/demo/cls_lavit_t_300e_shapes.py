# lavit/cls_lavit_t_300e_in1k.py on the class-folder copy of the embedded shapes data (CPU-sized):
# model (the diagonality-preserving loss included), optimiser and weight decay rules unchanged but
# for the 8 classes; the data and schedule overrides of every demo classifier
# (_base_/shapes_cls_demo.py: 64x64 crops, batch 32, 300 iterations, lr 3e-4, no EMA / Mixup /
# CutMix / RandAugment). Trained from scratch.
_base_ = ['../lavit/cls_lavit_t_300e_in1k.py', '../_base_/shapes_cls_demo.py']
_base_.merge(_base_.pop('shapes_cls'))
