"""Helpers for the golden tests against official implementations (``tests/data/golden``).

The golden files were produced by running the official code outside this repository (see
``tests/data/golden/README.md``). Only data is stored; the weights of the large configurations
are not, because they follow a deterministic rule of (parameter name, shape) implemented here
and in the generator independently. ``test_golden_flatten.py`` checks that this implementation
reproduces the stored weights of the small configurations bit for bit.
"""
import os.path as osp
import zlib

import torch
import torch.nn.functional as F

GOLDEN_DIR = osp.join(osp.dirname(osp.abspath(__file__)), 'data', 'golden')

# leaf names of the parameters that the official code creates as zeros (or tiny); they get
# their own scales so that the tests exercise them
_POSITION_LEAVES = ('positional_encoding', 'absolute_pos_embed')


def golden_fill(key, shape):
    """Deterministic value of the official parameter ``key`` with ``shape``.

    The generator is seeded with ``zlib.crc32(key)`` (UTF-8), a float64 standard normal
    tensor ``x`` of ``shape`` is drawn and scaled by the parameter's role, judged from the last
    component of the name:

    - ``scale`` (FLA temperature): ``0.5·x``
    - ``positional_encoding``, ``absolute_pos_embed``, ``pos_embed*``: ``0.02·x``
    - ``relative_position_bias_table``: ``0.5·x``
    - ``bias``: ``0.02·x``
    - a 1-D ``weight`` (LayerNorm / BatchNorm): ``1 + 0.1·x``
    - any other ``weight`` (Linear, Conv): ``x / sqrt(fan_in)``, ``fan_in = prod(shape[1:])``

    The result is rounded to float32 (the stored dtype of checkpoints); the tests then run in
    float64 on these exactly representable values.
    """
    shape = tuple(int(s) for s in shape)
    gen = torch.Generator().manual_seed(zlib.crc32(key.encode('utf-8')))
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    leaf = key.rsplit('.', 1)[-1]
    if leaf == 'scale':
        value = x * 0.5
    elif leaf in _POSITION_LEAVES or leaf.startswith('pos_embed'):
        value = x * 0.02
    elif leaf == 'relative_position_bias_table':
        value = x * 0.5
    elif leaf == 'bias':
        value = x * 0.02
    elif leaf == 'weight' and len(shape) == 1:
        value = 1.0 + 0.1 * x
    elif leaf == 'weight':
        fan_in = 1
        for size in shape[1:]:
            fan_in *= size
        value = x / fan_in ** 0.5
    else:
        raise KeyError(f'no golden fill rule for {key!r}')
    return value.to(torch.float32)


def golden_state_dict(param_shapes):
    """Official-layout state dict ``{key: golden_fill(key, shape)}`` for ``{key: shape}``."""
    return {key: golden_fill(key, shape) for key, shape in param_shapes.items()}


def load_golden(family, name):
    """The golden record ``tests/data/golden/<family>/<name>.pt`` (plain tensors and values)."""
    return torch.load(osp.join(GOLDEN_DIR, family, name + '.pt'), map_location='cpu',
                      weights_only=True)


def golden_input(family, record):
    """The float16-rounded input image of ``record`` (a stored tensor or a shared file)."""
    if record.get('input') is not None:
        return record['input']
    shared = torch.load(osp.join(GOLDEN_DIR, family, record['input_file']), map_location='cpu',
                        weights_only=True)
    return shared['input']


def map_to_tokens(feature_map):
    """``(B, C, H, W)`` map → ``(B, H·W, C)`` row-major tokens (the official layout)."""
    return feature_map.flatten(2).transpose(1, 2)


def layer_norm_head_logits(tokens, state_dict, norm_key=None, eps=1e-5):
    """Classification logits of an official model from its last-stage tokens ``(B, N, C)``.

    Optionally applies the final LayerNorm ``norm_key`` (``'norm'``), then averages the tokens
    and applies ``head`` — using the official-layout weights of ``state_dict``.
    """
    x = tokens
    if norm_key is not None:
        x = F.layer_norm(x, x.shape[-1:], state_dict[norm_key + '.weight'].to(x.dtype),
                         state_dict[norm_key + '.bias'].to(x.dtype), eps)
    x = x.mean(dim=1)
    return F.linear(x, state_dict['head.weight'].to(x.dtype), state_dict['head.bias'].to(x.dtype))
