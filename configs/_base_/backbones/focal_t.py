# The Focal-T backbone as the Focal Transformer configs use it: the linear-embedding model (49M
# parameters in Mask R-CNN, the README's count), keys beyond the image and in padding excluded
# (not wrapped), the four stage outputs (the RetinaNet configs take stages 2-4), drop path 0.2
# (the authors' detection value is unpublished: ImageNet's for T; mmseg's Swin UperNet: 0.3),
# initialised from the official ImageNet-1k weights. A config takes it with
# `model = dict(backbone=_base_.pop('backbone'), ...)`, which also drops this helper key from the
# config (configs/README.md); `_delete_` replaces the base model's ResNet.
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official Focal-T ImageNet-1k weights (microsoft/Focal-Transformer, focal-tiny-is224-ws7.pth; the
# official links are dead, fill in your copy). Expected on loading: missing norm0..norm3 (fresh
# output norms) and stage 4's relative_position_bias_table_to_neighbors (the 224² model has a
# 7x7 stage-4 map and no surroundings there; at detection sizes it is used, freshly initialised).
pretrained = 'checkpoints/focal-tiny-is224-ws7.pth'
backbone = dict(
    _delete_=True,
    type='FocalTransformer',
    arch='tiny',
    use_conv_embed=False,
    mask_borders=True,
    drop_path_rate=0.2,
    out_indices=(0, 1, 2, 3),
    init_cfg=dict(type='Pretrained', checkpoint=pretrained))
