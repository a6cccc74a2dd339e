# flatten/cls_flatten_pvtv2_b0_300e_in1k.py (FLatten-PVTv2-B0) on the class-folder copy of the
# embedded shapes data (CPU-sized): model and optimiser unchanged but for the 8 classes; the
# data and schedule overrides of every demo classifier (_base_/shapes_cls_demo.py: 64x64 crops,
# batch 32, 300 iterations, lr 3e-4, no EMA / Mixup / CutMix / RandAugment). From scratch.
_base_ = ['../flatten/cls_flatten_pvtv2_b0_300e_in1k.py', '../_base_/shapes_cls_demo.py']
_base_.merge(_base_.pop('shapes_cls'))
