# Focal-T as the official ImageNet-1k classifier (Yang et al., NeurIPS 2021; official
# focal_tiny_patch4_window7_224.yaml): the official structure at 224x224 (no window surroundings in
# stage 4, whose 7x7 map is one window: expand_sizes 3-3-3-0; surroundings read across the border
# as the official rolls do: mask_borders=False), the official final LayerNorm `norm`
# (backbone.final_norm), global average pooling and a linear head. Drop path 0.2 (yaml).
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='FocalTransformer',
        arch='tiny',
        expand_sizes=(3, 3, 3, 0),
        mask_borders=False,
        drop_path_rate=0.2,
        out_indices=(3, ),
        final_norm=True),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=768,
        init_cfg=None,  # initialised by the model's init_cfg
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    # head and norms as mmpretrain's classifiers; the backbone then applies its own (official) init
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
        dict(type='Constant', layer='LayerNorm', val=1., bias=0.),
    ])
