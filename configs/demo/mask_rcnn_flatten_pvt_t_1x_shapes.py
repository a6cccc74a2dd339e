# The demo: flatten/mask_rcnn_flatten_pvt_t_1x_coco.py unchanged in model and optimiser, on the
# embedded shapes data with a short CPU-sized schedule (python -m mmeffvit.datasets.shapes --out
# data/shapes; tools/demo.py runs it). The data and schedule overrides are those of every demo
# detector, in _base_/shapes_coco_demo.py; here: the 4 classes, a higher lr (2e-4) and RoIAlign
# sampling 2x2 points per bin instead of adaptively: mmcv's CPU RoIAlign backward with adaptive
# sampling grows with the proposals' size and came to dominate CPU training (25 s/iter).
_base_ = ['../flatten/mask_rcnn_flatten_pvt_t_1x_coco.py', '../_base_/shapes_coco_demo.py']
_base_.merge(_base_.pop('shapes_coco').instance)

model = dict(
    roi_head=dict(
        bbox_roi_extractor=dict(roi_layer=dict(sampling_ratio=2)),
        mask_roi_extractor=dict(roi_layer=dict(sampling_ratio=2)),
        bbox_head=dict(num_classes=len(_base_.classes)),
        mask_head=dict(num_classes=len(_base_.classes))))
optim_wrapper = dict(optimizer=dict(lr=0.0002))
