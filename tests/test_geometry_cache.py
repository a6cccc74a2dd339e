"""Per-geometry tables: built once per key and mode, apart under inference mode, rebuilt (not
looked up) while a compiler traces, never copied with their owner; and the host-built tables
equal to what the device code they replace computed."""
import copy

import numpy as np
import pytest
import torch

from mmeffvit.models.backbones.focal_transformer import ring_slots
from mmeffvit.models.layers.relative_position import SHIFT_MASK_VALUE, shifted_window_mask
from mmeffvit.models.layers.window import window_order, window_order_unpadded
from mmeffvit.utils.geometry_cache import GeometryCache, geometry_cached


def test_built_once_per_key_and_inference_mode():
    builds = []
    cache = GeometryCache(maxsize=2)

    def build():
        builds.append(1)
        return torch.arange(3)

    first = cache((4, 5), build)
    assert cache((4, 5), build) is first and len(builds) == 1
    with torch.inference_mode():
        inner = cache((4, 5), build)
    assert inner is not first and len(builds) == 2 and inner.is_inference()
    assert not cache((4, 5), build).is_inference()  # the training-safe entry still there
    cache((6, 7), build)  # full: cleared as a whole, then kept
    assert len(cache) == 1


def test_copies_and_pickles_start_empty():
    cache = GeometryCache(maxsize=3)
    cache('key', lambda: torch.ones(2))
    clone = copy.deepcopy(cache)
    assert len(clone) == 0 and clone.maxsize == 3 and len(cache) == 1


def test_traced_builders_are_called_not_looked_up():
    calls = []

    @geometry_cached()
    def table(n, device):
        calls.append(n)
        return torch.from_numpy(np.arange(n)[::-1].copy()).to(device)

    def f(x):
        return x.index_select(0, table(x.shape[0], x.device)) * 2

    x = torch.randn(5)
    compiled = torch.compile(f, backend='eager', fullgraph=True)
    torch.testing.assert_close(compiled(x), f(x))
    assert len(table.cache) == 1  # the eager call's entry only: the trace kept nothing
    assert calls.count(5) == 2  # built once eagerly, once by the trace


@pytest.mark.parametrize('hw,window,shift', [((9, 13), 4, 0), ((9, 13), 4, 2), ((7, 7), 7, 3)])
def test_padding_slots_are_those_a_search_finds(hw, window, shift):
    height, width = hw
    slots, padding = window_order_unpadded(height, width, window, shift)
    hp, wp = height + -height % window, width + -width % window
    order = window_order(hp, wp, window, shift).numpy()
    inside = (order // wp < height) & (order % wp < width)
    np.testing.assert_array_equal(padding.numpy(), np.flatnonzero(~inside))
    np.testing.assert_array_equal(slots.numpy()[inside],
                                  (order // wp * width + order % wp)[inside])


@pytest.mark.parametrize('window,expand', [(7, 3), (7, 1), (4, 2)])
def test_ring_slots_are_those_a_search_finds(window, expand):
    e, w = expand, window
    expected = []
    for sy, sx in ((-e, -e), (-e, e), (e, -e), (e, e)):
        keep = np.ones((w, w), dtype=bool)
        keep[slice(None, -e) if sy < 0 else slice(e, None),
             slice(None, -e) if sx < 0 else slice(e, None)] = False
        ii, jj = np.nonzero(keep)
        expected.append(np.stack([ii, jj, np.full_like(ii, -sy), np.full_like(jj, -sx)], 1))
    np.testing.assert_array_equal(ring_slots(w, e).numpy(), np.concatenate(expected))


def test_shift_mask_marks_pairs_from_different_regions():
    """Swin's mask (sec. 3.2) from its definition: the labels of the shifted map's strips."""
    height, width, window, shift = 14, 21, 7, 3
    mask = shifted_window_mask(height, width, window, shift)
    label = lambda size: torch.bucketize(torch.arange(size),  # noqa: E731
                                         torch.tensor([size - window, size - shift]), right=True)
    region = label(height)[:, None] * 3 + label(width)[None, :]
    region = region.view(height // window, window, width // window, window)
    region = region.permute(0, 2, 1, 3).reshape(-1, window * window)
    expected = (region[:, :, None] != region[:, None, :]).float() * SHIFT_MASK_VALUE
    assert mask.dtype == torch.float32
    torch.testing.assert_close(mask, expected, rtol=0, atol=0)
