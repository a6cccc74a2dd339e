# FLatten-CSWin-T as the official ImageNet-1k classifier (FLatten paper sec. 5.1; official
# FLatten_CSWin_64_24181_tiny_224 with flatten_cswin_t.yaml): focused linear attention over the
# whole map in stages 1-2, cross-shaped stripes of width 7 in stage 3, one softmax branch over the
# 7x7 map in stage 4, then the official final LayerNorm `norm` (backbone.final_norm), global
# average pooling and a linear head. Drop path 0.2 (yaml; the official runs always keep an EMA of
# the weights, decay 0.99984: a recipe setting). Official weights:
# tools/model_converters/official2mmpretrain.py.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='FLattenCSWin',
        arch='tiny',
        attn_types='LLSS',
        drop_path_rate=0.2,
        out_indices=(3, ),
        final_norm=True),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=512,
        init_cfg=None,  # initialised by the model's init_cfg
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    # head and norms as mmpretrain's classifiers; the backbone then applies its own (official) init
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
        dict(type='Constant', layer='LayerNorm', val=1., bias=0.),
    ])
