# lavit/retinanet_lavit_s_1x_coco.py on the embedded shapes data: retinanet_lavit_t_1x_shapes.py
# with the LaViT-S backbone, as retinanet_lavit_s_1x_coco.py derives from
# retinanet_lavit_t_1x_coco.py.
_base_ = ['./retinanet_lavit_t_1x_shapes.py']

model = dict(backbone=dict(arch='small'), neck=dict(in_channels=[64, 128, 320, 512]))
