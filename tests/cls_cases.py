"""Small classifiers of every family for the classification tests (mmpretrain and timm).

Each case names the model base config (``configs/_base_/models/cls_*.py``), the timm entry point
of the same classifier, backbone settings that make it small (only the widths and depths shrink:
window rules, final norm and head stay the config's) and the official classifier head as the
papers' code describes it, which :func:`reference_logits` re-implements with plain torch ops.
"""
import os.path as osp

import torch
import torch.nn.functional as F
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
_PYRAMID = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2],
                depths=[1, 1, 1, 1])
_WINDOWED = dict(embed_dims=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4])

# head: 'mean' (official: mean of the last tokens, no norm of its own), 'norm_mean' (final
# LayerNorm with eps, mean, linear), 'care' (mean, then GELU -> LayerNorm(1e-6) -> linear twice,
# averaged), 'cls_token' (DeiT: final LayerNorm(1e-6) on the tokens, the cls token, linear)
CASES = {
    'flatten_pvt': dict(config=None, timm='flatten_pvt_tiny', head='mean',
                        backbone=dict(type='FLattenPVT', arch=dict(_PYRAMID))),
    'flatten_pvtv2': dict(config='cls_flatten_pvtv2_b0.py', timm='flatten_pvt_v2_b0',
                          head='mean', backbone=dict(arch=dict(_PYRAMID))),
    'flatten_swin': dict(config='cls_flatten_swin_t.py', timm='flatten_swin_tiny',
                         head='norm_mean', eps=1e-5, backbone=dict(arch=dict(_WINDOWED))),
    'flatten_cswin': dict(config='cls_flatten_cswin_t.py', timm='flatten_cswin_tiny',
                          head='norm_mean', eps=1e-5,
                          backbone=dict(arch=dict(_WINDOWED, depths=[1, 1, 1, 1]))),
    'flatten_deit': dict(config='cls_flatten_deit_t.py', timm=None, head='cls_token', eps=1e-6,
                         backbone=dict(arch=dict(embed_dims=32, num_heads=2, depth=2))),
    'lavit': dict(config='cls_lavit_t.py', timm='lavit_tiny', head='norm_mean', eps=1e-6,
                  backbone=dict(arch=dict(_PYRAMID, sr_ratios=[8, 4, 2, 1], depths=[1, 1, 2, 2],
                                          num_va_layers=[1, 1, 1, 1]))),
    'care': dict(config='cls_care_s0.py', timm='CARETrans_S0', head='care',
                 backbone=dict(arch=dict(depths=[1, 1, 1, 2], mem_dims=[4, 8, 8, 16],
                                         ratios=[(2, 2)] * 4, head_dims=[None, None, 8, 8]))),
    'l2vit': dict(config='cls_l2vit_t.py', timm='L2ViT_Tiny', head='norm_mean', eps=1e-5,
                  backbone=dict(arch=dict(embed_dims=[16, 32, 64, 128], depths=[2, 2, 2, 2],
                                          num_heads=[1, 2, 4, 8]))),
    'focal': dict(config='cls_focal_t.py', timm='focal_tiny_patch4_window7_224',
                  head='norm_mean', eps=1e-5,
                  backbone=dict(arch=dict(_WINDOWED, depths=[1, 1, 1, 1]))),
}
NUM_CLASSES = 7


def config_path(name):
    return osp.join(ROOT, 'configs', '_base_', 'models', CASES[name]['config'])


def classifier_cfg(name, small=True):
    """The mmpretrain model dict of a case: its config's, or made small with NUM_CLASSES."""
    case = CASES[name]
    if case['config'] is None:  # FLatten-PVT-T's model base is another helper's file
        model = dict(type='ImageClassifier', backbone=dict(case['backbone'], out_indices=(3, )),
                     neck=dict(type='GlobalAveragePooling'),
                     head=dict(type='LinearClsHead', num_classes=1000, in_channels=512,
                               loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1,
                                         mode='original')))
    else:
        model = Config.fromfile(config_path(name)).model.to_dict()
    if small:
        model['backbone'].update(case['backbone'])
        model['head']['num_classes'] = NUM_CLASSES
    return model


def build_classifier(name, small=True):
    """The case's mmpretrain classifier; head channels follow the (small) backbone."""
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    cfg = classifier_cfg(name, small)
    backbone = MODELS.build(cfg['backbone'])
    channels = getattr(backbone, 'out_channels', None) or backbone.embed_dims
    cfg['head']['in_channels'] = channels[-1] if isinstance(channels, (list, tuple)) else channels
    return MODELS.build(cfg)


def randomise_(model, seed=0):
    """Random values in every parameter (norms and biases too), so a skipped norm shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1
                        + (1 if param.dim() == 1 else 0))
    return model


def reference_logits(name, backbone, weights, x):
    """Logits of the official classifier head, written from the papers' code with plain torch.

    ``backbone`` gives the last stage's raw features (before any final norm: ``forward_raw``);
    ``weights`` is the classifier's state dict (``backbone.norm.*``, ``head.*``).
    """
    case = CASES[name]
    raw = backbone.forward_raw(x)[-1]
    if case['head'] == 'cls_token':  # raw = cls token of the normed tokens: see the test
        raise ValueError('DeiT is compared in its own test')
    tokens = raw.flatten(2).transpose(1, 2)  # (B, N, C)
    if case['head'] == 'norm_mean':
        tokens = F.layer_norm(tokens, tokens.shape[-1:], weights['backbone.norm.weight'],
                              weights['backbone.norm.bias'], case['eps'])
    pooled = tokens.mean(dim=1)
    if case['head'] != 'care':
        return F.linear(pooled, weights['head.fc.weight'], weights['head.fc.bias'])
    logits = []
    for norm, fc in (('head.norm', 'head.fc'), ('head.dist_norm', 'head.dist_fc')):
        hidden = F.layer_norm(F.gelu(pooled), pooled.shape[-1:], weights[f'{norm}.weight'],
                              weights[f'{norm}.bias'], 1e-6)
        logits.append(F.linear(hidden, weights[f'{fc}.weight'], weights[f'{fc}.bias']))
    return (logits[0] + logits[1]) / 2


def official_layout(name, weights):
    """The classifier's state dict renamed to the official code's names (the reverse of the
    conversion, written out here): ``backbone.`` dropped, ``head.fc.`` -> ``head.``, CARE's
    ``head.dist_*`` -> ``dist_head.*``; FLatten-PVT v1 files also hold an unused final norm."""
    out = {}
    for key, value in weights.items():
        if key.startswith('backbone.'):
            key = key[len('backbone.'):]
        elif CASES[name]['head'] == 'care':
            key = 'dist_head.' + key[len('head.dist_'):] if key.startswith('head.dist_') else key
        else:
            key = 'head.' + key[len('head.fc.'):]
        out[key] = value.clone()
    if name == 'flatten_pvt':
        channels = weights['head.fc.weight'].shape[1]
        out['norm.weight'], out['norm.bias'] = torch.ones(channels), torch.zeros(channels)
    return out
