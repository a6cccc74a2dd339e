# The segmentation demo: flatten/fpn_flatten_pvt_t_80k_ade20k.py unchanged in model and optimiser,
# on the ADE20K-layout copy of the embedded shapes data with a short CPU-sized schedule; the data
# and schedule overrides are those of every demo segmentor (_base_/shapes_ade20k_demo.py). Here:
# batch 4 and a higher lr (2e-4). No ImageNet weights.
_base_ = ['../flatten/fpn_flatten_pvt_t_80k_ade20k.py', '../_base_/shapes_ade20k_demo.py']
_base_.merge(_base_.pop('shapes_ade20k'))

train_dataloader = dict(batch_size=4)
optim_wrapper = dict(optimizer=dict(lr=0.0002))
