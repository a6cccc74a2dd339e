# Mask R-CNN + FPN with a CARE-S1 backbone, COCO instance segmentation, 1x schedule: the CARE-S0
# recipe (mask_rcnn_care_s0_1x_coco.py) with the S1 backbone (same widths as S0, deeper).
_base_ = ['./mask_rcnn_care_s0_1x_coco.py']

# official CARE-S1 ImageNet-1k weights (CARETrans_S1.pth.tar); fill in your path
pretrained = 'checkpoints/CARETrans_S1.pth.tar'
model = dict(backbone=dict(arch='s1', init_cfg=dict(checkpoint=pretrained)))
