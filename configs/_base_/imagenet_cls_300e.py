# ImageNet-1k training from scratch as the families' official code runs it (DeiT / Swin / ConvNeXt
# recipes on timm), in mmpretrain's terms, for 224x224 inputs; a family config (configs/<family>/
# cls_*_300e_in1k.py) combines it with its model base (_base_/models/cls_<backbone>.py) and states
# its batch, warm-up, learning-rate bounds, gradient clipping and EMA. Written once here:
#
# * data (mmpretrain's Swin pipeline, which is timm's): data/imagenet/{train,val} in the standard
#   class-folder layout (mmpretrain's ImageNet dataset; meta/{train,val}.txt are used if present);
#   RandomResizedCrop 224 (bicubic), horizontal flip, RandAugment rand-m9-mstd0.5-inc1 (2 ops,
#   magnitude 9 +- 0.5 of 10, the "increasing" policies), RandomErasing p=0.25 with per-pixel
#   random values; test: short side to 256 (crop_pct 0.875, bicubic) and centre crop 224;
# * Mixup (alpha 0.8) or CutMix (alpha 1.0), one of the two per batch, on every batch, as batch
#   augments of the data preprocessor; label smoothing 0.1 is the model base's LabelSmoothLoss
#   (smoothing the mixed targets equals timm's mixing of smoothed targets);
# * AdamW (betas 0.9 / 0.999, eps 1e-8), weight decay 0.05, none on norms, biases and other 1-D
#   tensors nor on Swin-style relative-position tables / absolute position embeddings (the
#   families' no_weight_decay lists; FLatten's `scale` / `positional_encoding` and PVT's
#   `pos_embed{i}` are decayed, as in the official code), lr 5e-4 x batch / 512 for batch
#   8 x 128 = 1024 (auto_scale_lr: --auto-scale-lr rescales it to the batch actually used);
# * 300 epochs, per-iteration linear warm-up and cosine decay. Here Swin's code-base defaults
#   (warm-up 20 epochs from 5e-7 / 5e-4 of the lr, cosine to 5e-6 / 5e-4 of it, both scaled with
#   the batch like the lr): eta_min_ratio keeps the lower bound proportional under
#   --auto-scale-lr;
# * top-1 / top-5 (mmpretrain's Accuracy) after every epoch; the last 3 checkpoints and the best
#   top-1 one are kept.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]

data_preprocessor = dict(
    batch_augments=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))

train_dataloader = dict(batch_size=128)  # per GPU; 8 GPUs
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=5e-4 * 1024 / 512))
param_scheduler = [
    dict(type='LinearLR', start_factor=5e-7 / 5e-4, by_epoch=True, begin=0, end=20,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=5e-6 / 5e-4, by_epoch=True, begin=20, end=300,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
auto_scale_lr = dict(base_batch_size=1024)

default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=3, save_best='auto'))
