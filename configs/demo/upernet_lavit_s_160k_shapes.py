# lavit/upernet_lavit_s_160k_ade20k.py on the ADE20K-layout copy of the embedded shapes data
# (CPU-sized): model, optimiser and the diagonality-preserving loss (`loss_diag`) unchanged; the
# data and schedule overrides of every demo segmentor (_base_/shapes_ade20k_demo.py), with the
# auxiliary head on the 5 classes and the poly decay of the full-size config (power 1.0).
_base_ = ['../lavit/upernet_lavit_s_160k_ade20k.py', '../_base_/shapes_ade20k_demo.py']
_base_.merge(_base_.pop('shapes_ade20k'))

model = dict(auxiliary_head=dict(num_classes=_base_.model.decode_head.num_classes))
param_scheduler = [
    _base_.param_scheduler[0],  # the demo's warm-up
    dict(_base_.param_scheduler[1], power=1.0),
]
