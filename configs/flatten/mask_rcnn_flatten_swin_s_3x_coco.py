# Mask R-CNN + FPN with a FLatten-Swin-S backbone, COCO, 3x schedule (FLatten paper sec. 5.3):
# the FLatten-Swin-T recipe with the small arch. drop_path_rate 0.2 as mmdet's Swin-S detection
# config (which inherits Swin-T's) and Swin's own Swin-S detection configs.
_base_ = ['./mask_rcnn_flatten_swin_t_3x_coco.py']

# official FLatten-Swin-S ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_swin_s.pth'
model = dict(backbone=dict(arch='small', drop_path_rate=0.2, init_cfg=dict(checkpoint=pretrained)))
