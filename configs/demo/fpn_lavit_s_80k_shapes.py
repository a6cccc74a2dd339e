# lavit/fpn_lavit_s_80k_ade20k.py on the ADE20K-layout copy of the embedded shapes data
# (CPU-sized): model, optimiser and the diagonality-preserving loss (`loss_diag`) unchanged; the
# data and schedule overrides of every demo segmentor (_base_/shapes_ade20k_demo.py: 256x256
# crops, batch 2, 300 iterations, no ImageNet weights).
_base_ = ['../lavit/fpn_lavit_s_80k_ade20k.py', '../_base_/shapes_ade20k_demo.py']
_base_.merge(_base_.pop('shapes_ade20k'))
