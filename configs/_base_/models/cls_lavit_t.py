# LaViT-T as an ImageNet-1k classifier (Zhang et al., CVPR 2024, sec. 3-4). No LaViT code is
# public: the classifier assumed is PVT's (the layout LaViT builds on, sec. 4.1), a final
# LayerNorm `norm` (eps 1e-6, backbone.final_norm) on stage 4, the mean of its tokens and a linear
# head. The diagonality-preserving loss of sec. 3.4 on the less-attention maps (weight 0.01) is
# added to the loss dict as `loss_diag` by AuxLossImageClassifier. Less attention runs per window
# of the 224x224 training grid (la_mode='window': the dense form at 224, any other size works).
# Drop path 0.1 (PVT-T's).
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

model = dict(
    type='AuxLossImageClassifier',
    backbone=dict(
        type='LaViT',
        arch='tiny',
        la_mode='window',
        diag_loss=dict(type='DiagonalityLoss', loss_weight=0.01),
        drop_path_rate=0.1,
        out_indices=(3, ),
        final_norm=True),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=448,
        init_cfg=None,  # initialised by the model's init_cfg
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    # head and norms as mmpretrain's classifiers; the backbone then applies its own init
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
        dict(type='Constant', layer='LayerNorm', val=1., bias=0.),
    ])
