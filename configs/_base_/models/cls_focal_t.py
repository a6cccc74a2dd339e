# Focal-T as the official ImageNet-1k classifier (Yang et al., NeurIPS 2021; official
# focal_tiny_patch4_window7_224.yaml): the official structure at 224x224 (no window surroundings in
# stage 4, whose 7x7 map is one window: expand_sizes 3-3-3-0; surroundings read across the border
# as the official rolls do: mask_borders=False), the official final LayerNorm `norm`
# (backbone.final_norm), global average pooling and a linear head. Drop path 0.2 (yaml).
_base_ = ['./cls_linear_head.py']

model = dict(
    backbone=dict(
        type='FocalTransformer',
        arch='tiny',
        expand_sizes=(3, 3, 3, 0),
        mask_borders=False,
        drop_path_rate=0.2,
        out_indices=(3, ),
        final_norm=True),
    head=dict(in_channels=768))
