# What every mmeffvit ImageNet classifier shares (mmpretrain ImageClassifier): the backbone's last
# stage, global average pooling and a linear head with DeiT's label smoothing 0.1 (Mixup / CutMix
# come from the recipe's data preprocessor, _base_/imagenet_cls_300e.py). The head and the norms
# are initialised by the classifier's rules, as mmpretrain's Swin / DeiT configs do; the backbone
# then applies its own (official) initialisation. A model base states its backbone and in_channels.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        init_cfg=None,  # initialised by the model's init_cfg
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
        dict(type='Constant', layer='LayerNorm', val=1., bias=0.),
    ])
