# Cascade Mask R-CNN + FPN (4conv1fc GIoU box heads) with a FLatten-Swin-S backbone, COCO, 3x
# multi-scale + crop schedule (FLatten paper sec. 5.3): the FLatten-Swin-T cascade recipe with the
# small arch; drop_path_rate 0.2 as Swin's own Swin-S cascade config.
_base_ = ['./cascade_mask_rcnn_flatten_swin_t_3x_coco.py']

# official FLatten-Swin-S ImageNet-1k weights (FLatten-Transformer release); fill in your path
pretrained = 'checkpoints/flatten_swin_s.pth'
model = dict(backbone=dict(arch='small', drop_path_rate=0.2, init_cfg=dict(checkpoint=pretrained)))
