# L2ViT-T as the official ImageNet-1k classifier (Zheng, arXiv 2501.16182; official
# classification/models/l2vit.py, L2ViT_Tiny): alternating local-window and clamped linear global
# attention blocks, the official final LayerNorm `norm` (backbone.final_norm), global average
# pooling and a linear head. Drop path 0.1 (the README gives 0.3 for B only; T's value is not
# published). The official runs keep an EMA of the weights (decay 0.9999): a recipe setting.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='L2ViT', arch='tiny', drop_path_rate=0.1, out_indices=(3, ), final_norm=True),
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
        dict(type='Constant', layer=['LayerNorm', '_BatchNorm'], val=1., bias=0.),
    ])
