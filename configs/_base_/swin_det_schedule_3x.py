# The Swin detection recipe's 3x schedule (Swin sec. 4.2): the optimiser and warm-up of
# swin_det_schedule_1x.py, 36 epochs with lr x0.1 after epochs 27 and 33.
_base_ = ['./swin_det_schedule_1x.py']

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
         gamma=0.1),
]
