# RetinaNet + FPN with a FLatten-PVT-S backbone, COCO detection, 1x schedule (recipe of
# retinanet_flatten_pvt_t_1x_coco.py: AdamW lr 1e-4, weight decay 1e-4).
_base_ = ['./retinanet_flatten_pvt_t_1x_coco.py']

# FLatten-PVT-S ImageNet-1k weights (not released by FLatten; train or convert your own)
pretrained = 'checkpoints/flatten_pvt_s.pth'
model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)))
