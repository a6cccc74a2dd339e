"""CARE Transformer's classifier head (Zhou et al., CVPR 2025), for mmpretrain and timm.

The official ``CARENets`` ends with two heads of one form (its ``Head`` class): globally pooled
stage-4 features → GELU → LayerNorm (eps 1e-6) → Dropout → Linear, once as ``head`` and once as
``dist_head``; in eval mode the two logits are averaged. mmpretrain's ``LinearClsHead`` cannot
express the activation, the norm nor the second head, hence :class:`CAREClsHead`. The layers
are declared once (:class:`CAREHeadMixin`) and shared by the mmpretrain head and the timm head
(:class:`CAREHead`), so both hold the same parameter names: ``norm``, ``fc`` and, with the
distillation head, ``dist_norm``, ``dist_fc`` (official ``head.*`` / ``dist_head.*``).
"""
import torch.nn as nn
from timm.layers import SelectAdaptivePool2d

from ...registry import register_model
from ..layers import LayerNormFP32


class CAREHeadMixin:
    """Builds and runs the layers of CARE's two heads on pooled ``(B, C)`` features."""

    def _build_care_layers(self, in_channels, num_classes, drop_rate=0., dist_head=True):
        self.in_channels, self.num_classes = in_channels, num_classes
        self.act = nn.GELU()
        self.drop = nn.Dropout(drop_rate)
        self.norm = LayerNormFP32(in_channels, eps=1e-6)
        self.fc = nn.Linear(in_channels, num_classes) if num_classes > 0 else nn.Identity()
        with_dist = dist_head and num_classes > 0
        self.dist_norm = LayerNormFP32(in_channels, eps=1e-6) if with_dist else None
        self.dist_fc = nn.Linear(in_channels, num_classes) if with_dist else None

    def _care_pre_logits(self, pooled):
        """The main head's features before its classifier (GELU, norm, dropout)."""
        return self.drop(self.norm(self.act(pooled)))

    def _care_logits(self, pooled):
        """Logits of each head: ``[head]`` or ``[head, dist_head]``."""
        logits = [self.fc(self._care_pre_logits(pooled))]
        if self.dist_fc is not None:
            logits.append(self.dist_fc(self.drop(self.dist_norm(self.act(pooled)))))
        return logits


class CAREHead(CAREHeadMixin, nn.Module):
    """CARE's classifier for the timm models (:mod:`mmeffvit.models.timm_models`).

    Same interface as timm's ``ClassifierHead`` (``forward(x, pre_logits)``, ``reset``): global
    pooling of the ``(B, C, H, W)`` map, then the official heads, their logits averaged.
    ``num_classes=0`` keeps the main head's GELU and norm (its pre-logits are the features, as
    for timm's norm heads) and drops the classifiers; ``pool_type=''`` returns the map
    unpooled and needs ``num_classes=0``.
    """

    def __init__(self, in_channels, num_classes, pool_type='avg', drop_rate=0., dist_head=True):
        super().__init__()
        self._check(num_classes, pool_type)
        self.global_pool = SelectAdaptivePool2d(pool_type=pool_type, flatten=bool(pool_type))
        self.with_dist_head = dist_head
        self._build_care_layers(in_channels, num_classes, drop_rate, dist_head)

    @staticmethod
    def _check(num_classes, pool_type):
        if not pool_type and num_classes > 0:
            raise ValueError("global_pool='' (unpooled features) needs num_classes=0")

    def reset(self, num_classes, pool_type=None):
        """New classifiers for ``num_classes`` (and a new pooling), like timm's heads."""
        pool_type = self.global_pool.pool_type if pool_type is None else pool_type
        self._check(num_classes, pool_type)
        self.global_pool = SelectAdaptivePool2d(pool_type=pool_type, flatten=bool(pool_type))
        self.num_classes = num_classes
        self.fc = nn.Linear(self.in_channels, num_classes) if num_classes > 0 else nn.Identity()
        if not (self.with_dist_head and num_classes > 0):
            self.dist_norm = self.dist_fc = None
        elif self.dist_fc is not None:
            self.dist_fc = nn.Linear(self.in_channels, num_classes)
        else:
            self.dist_norm = LayerNormFP32(self.in_channels, eps=1e-6)
            self.dist_fc = nn.Linear(self.in_channels, num_classes)

    def forward(self, x, pre_logits=False):
        x = self.global_pool(x)
        if self.global_pool.is_identity():
            return x
        if pre_logits:
            return self._care_pre_logits(x)
        logits = self._care_logits(x)
        return sum(logits) / len(logits)


try:
    from mmpretrain.models.heads import ClsHead
except ImportError:  # mmpretrain not installed: only the timm head exists
    ClsHead = None
else:
    @register_model
    class CAREClsHead(CAREHeadMixin, ClsHead):
        """mmpretrain head of CARE's official classifier (after a ``GlobalAveragePooling`` neck).

        Prediction: the mean of the two heads' logits (official eval). Training: each head's
        loss on the targets, weighted 0.5 (``loss_head``, ``loss_dist_head``). The official
        recipe trains ``dist_head`` by hard distillation from a RegNetY-160 teacher (DeiT's
        loss), which needs a teacher model that mmpretrain's ``ImageClassifier`` does not run;
        without it both heads learn the labels and the mean is a two-head ensemble.
        ``dist_head=False`` builds one head (official checkpoints then leave ``dist_head.*``
        unused).

        Args:
            num_classes (int): Number of classes.
            in_channels (int): Channels of the pooled features (1024 for CARE-S0/S1, 1536 S2).
            drop_rate (float): Dropout before the classifiers.
            dist_head (bool): Build the second (distillation) head.
            init_cfg (dict | list): Official init: trunc-normal 0.02 linear weights, zero bias.
            **kwargs: ``loss``, ``topk``, ``cal_acc`` of mmpretrain's ``ClsHead``.
        """

        def __init__(self, num_classes, in_channels, drop_rate=0., dist_head=True,
                     init_cfg=dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
                     **kwargs):
            super().__init__(init_cfg=init_cfg, **kwargs)
            if num_classes <= 0:
                raise ValueError(f'num_classes={num_classes} must be a positive integer')
            self._build_care_layers(in_channels, num_classes, drop_rate, dist_head)

        def pre_logits(self, feats):
            return self._care_pre_logits(feats[-1])

        def forward(self, feats):
            logits = self._care_logits(feats[-1])
            return sum(logits) / len(logits)

        def loss(self, feats, data_samples, **kwargs):
            logits = self._care_logits(feats[-1])
            losses = {}
            for name, score in zip(('head', 'dist_head'), logits):
                part = self._get_loss(score, data_samples, **kwargs)
                losses[f'loss_{name}'] = part.pop('loss') / len(logits)
                if name == 'head':
                    losses.update(part)  # accuracies (cal_acc) of the main head
            return losses
