# COCO instance segmentation with the Swin Transformer detection recipe (Liu et al., ICCV 2021,
# sec. 4.2; mmdet's swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py), which FLatten follows for its
# Swin-based detectors (FLatten paper sec. 5.3): single-scale 1333x800 training, 8 GPUs x 2 images
# (mmdet's COCO instance base), and the optimiser and schedule of swin_det_schedule_1x.py (AdamW
# lr 1e-4, weight decay 0.05, 1000-iteration warm-up, 12 epochs with steps at 8 and 11; no weight
# decay for norms and relative position bias tables, as mmdet's Swin). Neither for FLA's
# positional_encoding: it is a learned position table like the absolute_pos_embed that Swin's
# recipe excludes (the official ImageNet recipe decays it, and it decays FLA's per-channel `scale`,
# which stays decayed here).
_base_ = [
    'mmdet::_base_/datasets/coco_instance.py',
    './swin_det_schedule_1x.py',
]

optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'positional_encoding': dict(decay_mult=0.)}))
