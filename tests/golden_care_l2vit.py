"""Weights rule and loaders of the CARE and L²ViT golden records (tests/data/golden).

The records were produced by running the official code outside this repository (see the README
there). Full-size records store only parameter names and shapes; their weights follow the rule
below, implemented here independently of the generator. Small records store the full weights,
which lets a test check this rule against them.
"""
import os.path as osp
import zlib

import torch

GOLDEN_DIR = osp.join(osp.dirname(osp.abspath(__file__)), 'data', 'golden')


def fill(key, shape):
    """Deterministic value of the official state-dict entry ``key`` of ``shape``.

    A float64 standard normal ``x`` is drawn from a generator seeded with ``zlib.crc32(key)``
    and scaled by the entry's role (last component of the name): ``running_var`` → ``0.5+|x|``;
    ``running_mean`` and ``bias`` → ``0.1·x``; ``gamma`` (LayerScale) and ``temperature`` →
    ``0.3+0.2·x``; other 1-D entries (norm weights) → ``1+0.1·x``; everything else (conv and
    linear weights) → ``x/sqrt(fan_in)``. Rounded to float32.
    """
    shape = tuple(int(s) for s in shape)
    gen = torch.Generator().manual_seed(zlib.crc32(key.encode('utf-8')))
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    leaf = key.rsplit('.', 1)[-1]
    if leaf == 'running_var':
        value = 0.5 + x.abs()
    elif leaf in ('running_mean', 'bias'):
        value = 0.1 * x
    elif leaf in ('gamma', 'temperature'):
        value = 0.3 + 0.2 * x
    elif len(shape) == 1:
        value = 1.0 + 0.1 * x
    else:
        fan_in = 1
        for size in shape[1:]:
            fan_in *= size
        value = x / fan_in**0.5
    return value.to(torch.float32)


def load_record(family, name):
    return torch.load(osp.join(GOLDEN_DIR, family, name + '.pt'), map_location='cpu',
                      weights_only=True)


def official_state_dict(record):
    """The official-layout weights of a record (stored, or regenerated with :func:`fill`)."""
    if record.get('state_dict') is not None:
        return record['state_dict']
    return {k: (torch.zeros((), dtype=torch.long) if k.endswith('num_batches_tracked') else
                fill(k, shape)) for k, shape in record['param_shapes'].items()}


def check_stages(outs, record):
    """Compare our stage maps with a record: full tensors or strided samples and sums."""
    assert [tuple(o.shape) for o in outs] == [tuple(s) for s in record['stage_shapes']]
    if record.get('stages') is not None:
        for ours, ref in zip(outs, record['stages']):
            torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-9)
        return
    for i, ours in enumerate(outs):
        torch.testing.assert_close(ours.flatten()[::record['stride']], record['stage_samples'][i],
                                   rtol=1e-9, atol=1e-9)
        assert abs(ours.sum().item() - record['stage_sums'][i]) <= 1e-7 * record[
            'stage_abs_sums'][i]
