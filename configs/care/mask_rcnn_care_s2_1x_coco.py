# Mask R-CNN + FPN with a CARE-S2 backbone, COCO instance segmentation, 1x schedule: the CARE-S0
# recipe (mask_rcnn_care_s0_1x_coco.py) with the S2 backbone; its last block expands to 1536
# channels.
_base_ = ['./mask_rcnn_care_s0_1x_coco.py']

# official CARE-S2 ImageNet-1k weights (CARETrans_S2.pth.tar); fill in your path
pretrained = 'checkpoints/CARETrans_S2.pth.tar'
model = dict(
    backbone=dict(arch='s2', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[32, 64, 192, 1536]))
