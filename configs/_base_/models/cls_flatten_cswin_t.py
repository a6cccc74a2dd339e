# FLatten-CSWin-T as the official ImageNet-1k classifier (FLatten paper sec. 5.1; official
# FLatten_CSWin_64_24181_tiny_224 with flatten_cswin_t.yaml): focused linear attention over the
# whole map in stages 1-2, cross-shaped stripes of width 7 in stage 3, one softmax branch over the
# 7x7 map in stage 4, then the official final LayerNorm `norm` (backbone.final_norm), global
# average pooling and a linear head. Drop path 0.2 (yaml; the official runs always keep an EMA of
# the weights, decay 0.99984: a recipe setting). Official weights:
# tools/model_converters/official2mmpretrain.py.
_base_ = ['./cls_linear_head.py']

model = dict(
    backbone=dict(
        type='FLattenCSWin',
        arch='tiny',
        attn_types='LLSS',
        drop_path_rate=0.2,
        out_indices=(3, ),
        final_norm=True),
    head=dict(in_channels=512))
