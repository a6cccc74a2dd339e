# RetinaNet + FPN with a Focal-T backbone, COCO detection, 1x schedule (official README: 43.7 AP,
# 39M parameters). Detection code was never released; the README says the pipeline follows Swin's,
# so the optimiser is Swin's detection recipe: AdamW lr 1e-4, betas (0.9, 0.999), weight decay
# 0.05 (none for norms and the relative position bias tables), 1000-iteration linear warm-up,
# 12 epochs with steps at 8 and 11, single-scale 1333x800 training, 8 GPUs x 2 images. As mmdet's
# Swin RetinaNet, stages 2-4 feed the FPN (start level 0, extra convs on the input, 5 levels).
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmeffvit'], allow_failed_imports=False)

# official Focal-T ImageNet-1k weights (see mask_rcnn_focal_t_1x.py for the expected missing keys)
pretrained = 'checkpoints/focal-tiny-is224-ws7.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='FocalTransformer',
        arch='tiny',
        use_conv_embed=False,
        mask_borders=True,
        drop_path_rate=0.2,
        out_indices=(1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[192, 384, 768], start_level=0, add_extra_convs='on_input', num_outs=5))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, betas=(0.9, 0.999),
                   weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={
        'relative_position_bias_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.),
    }))
