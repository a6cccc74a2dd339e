# LaViT-T as an ImageNet-1k classifier (Zhang et al., CVPR 2024, sec. 3-4). No LaViT code is
# public: the classifier assumed is PVT's (the layout LaViT builds on, sec. 4.1), a final
# LayerNorm `norm` (eps 1e-6, backbone.final_norm) on stage 4, the mean of its tokens and a linear
# head. The diagonality-preserving loss of sec. 3.4 on the less-attention maps (weight 0.01) is
# added to the loss dict as `loss_diag` by AuxLossImageClassifier. Less attention runs per window
# of the 224x224 training grid (la_mode='window': the dense form at 224, any other size works).
# Drop path 0.1 (PVT-T's).
_base_ = ['./cls_linear_head.py']

model = dict(
    type='AuxLossImageClassifier',
    backbone=dict(
        type='LaViT',
        arch='tiny',
        la_mode='window',
        diag_loss=dict(type='DiagonalityLoss', loss_weight=0.01),
        drop_path_rate=0.1,
        out_indices=(3, ),
        final_norm=True),
    head=dict(in_channels=448))
