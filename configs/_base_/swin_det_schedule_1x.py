# Optimiser and 1x schedule of the Swin Transformer detection recipe (Liu et al., ICCV 2021,
# sec. 4.2; mmdet's swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py), for any COCO data base: AdamW
# lr 1e-4, betas (0.9, 0.999), weight decay 0.05 (none for norms and relative position bias
# tables), linear warm-up over 1000 iterations from 0.001x, 12 epochs with lr x0.1 after epochs 8
# and 11 (runtime and loops from mmdet's bases). Used with COCO instance data by
# swin_coco_instance_1x.py and with COCO boxes by the Focal-T RetinaNet (3x: swin_det_schedule_3x).
_base_ = [
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]

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
