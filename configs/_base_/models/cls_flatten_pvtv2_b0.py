# FLatten-PVTv2-B0 as the official ImageNet-1k classifier (FLatten paper sec. 5.1; official
# flatten_pvt_v2_b0 factory): four stages of focused linear attention, each ending with its
# LayerNorm norm{i} (norm4 is the official classifier's last norm, so no extra final norm), then
# the mean of the stage-4 tokens (global average pooling) and a linear head. Drop path 0.1
# (flatten_pvt_v2_b0.yaml). Official weights: tools/model_converters/official2mmpretrain.py.
# The data, schedule and Mixup/CutMix (train_cfg.augments) come from the recipe config.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(type='FLattenPVTv2', arch='b0', drop_path_rate=0.1, out_indices=(3, )),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=256,
        init_cfg=None,  # initialised by the model's init_cfg
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    # head and norms as mmpretrain's classifiers; the backbone then applies its own (official) init
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
        dict(type='Constant', layer='LayerNorm', val=1., bias=0.),
    ])
