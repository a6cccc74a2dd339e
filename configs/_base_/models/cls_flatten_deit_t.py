# FLatten-DeiT-T as an ImageNet-1k classifier (FLatten paper Table 3). No official FLatten-DeiT
# code exists; the classifier is DeiT's (Touvron et al., 2021): final LayerNorm `norm` (eps 1e-6)
# on the last block, the cls token, a linear head; drop path 0.1 (DeiT-T). DeiT's distillation
# token and head are not built.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='FLattenDeiT',
        arch='tiny',
        drop_path_rate=0.1,
        out_indices=-1,
        out_type='cls_token',
        final_norm=True),
    neck=None,
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=192,
        init_cfg=None,  # initialised by the model's init_cfg
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    # head and norms as mmpretrain's classifiers; the backbone then applies its own init
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
        dict(type='Constant', layer='LayerNorm', val=1., bias=0.),
    ])
