# FLatten-PVTv2-B0 as the official ImageNet-1k classifier (FLatten paper sec. 5.1; official
# flatten_pvt_v2_b0 factory): four stages of focused linear attention, each ending with its
# LayerNorm norm{i} (norm4 is the official classifier's last norm, so no extra final norm), then
# the mean of the stage-4 tokens (global average pooling) and a linear head. Drop path 0.1
# (flatten_pvt_v2_b0.yaml). Official weights: tools/model_converters/official2mmpretrain.py.
# The data, schedule and Mixup/CutMix (train_cfg.augments) come from the recipe config.
_base_ = ['./cls_linear_head.py']

model = dict(
    backbone=dict(type='FLattenPVTv2', arch='b0', drop_path_rate=0.1, out_indices=(3, )),
    head=dict(in_channels=256))
