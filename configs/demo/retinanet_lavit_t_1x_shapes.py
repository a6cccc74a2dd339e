# lavit/retinanet_lavit_t_1x_coco.py on the embedded shapes data (CPU-sized): model, optimiser and
# the diagonality-preserving loss (`loss_diag`) unchanged; the data and schedule overrides of every
# demo detector (_base_/shapes_coco_demo.py: 320x320 images, batch 2, 300 iterations, no ImageNet
# weights) and the 4 classes. Generate the data with `python -m mmeffvit.datasets.shapes --out
# data/shapes` (tools/demo.py does).
_base_ = ['../lavit/retinanet_lavit_t_1x_coco.py', '../_base_/shapes_coco_demo.py']
_base_.merge(_base_.pop('shapes_coco').detection)

model = dict(bbox_head=dict(num_classes=len(_base_.classes)))
