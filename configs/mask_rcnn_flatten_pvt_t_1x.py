# The README's first command trains this file: a stable entry point kept at the top of configs/
# under its original name. It is flatten/mask_rcnn_flatten_pvt_t_1x_coco.py unchanged (Mask R-CNN
# + FPN, FLatten-PVT-T, COCO 1x); edit that file, not this one. The default work_dir follows this
# file's name (work_dirs/mask_rcnn_flatten_pvt_t_1x/).
_base_ = ['./flatten/mask_rcnn_flatten_pvt_t_1x_coco.py']
