# Mask R-CNN + FPN with a FLatten-PVT-S backbone, COCO instance segmentation, 3x multi-scale
# schedule (recipe of mask_rcnn_flatten_pvt_t_3x_coco.py).
_base_ = ['./mask_rcnn_flatten_pvt_t_3x_coco.py']

# FLatten-PVT-S ImageNet-1k weights (not released by FLatten; train or convert your own)
pretrained = 'checkpoints/flatten_pvt_s.pth'
model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)))
