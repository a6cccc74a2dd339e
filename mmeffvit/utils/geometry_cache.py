"""Tables that depend only on a geometry (index maps and masks of windows, stripes, borders),
built once per geometry and device and shared.

The builders take Python integers and compute on the host (NumPy), then move the table to the
device once: no device computation whose result the host must wait for. Tensors made under
``inference_mode`` cannot be saved for a later backward, so they are cached apart.

While ``torch.compile`` or ``torch.export`` traces the caller, no cache is looked up: the
builder itself is traced, so its NumPy becomes constants of the graph (symbolic expressions of
the sizes under dynamic shapes) and the graph holds no dictionary or mode lookup. Builders must
therefore avoid operators whose output size depends on values (``np.nonzero``, boolean
indexing), which a trace cannot follow.

Example:
    >>> import numpy as np
    >>> @geometry_cached()
    ... def ramp(n, device):
    ...     return torch.from_numpy(np.arange(n)).to(device)
    >>> ramp(3, 'cpu') is ramp(3, 'cpu')
    True
"""
import functools

import torch


class GeometryCache:
    """Up to ``maxsize`` built tables, keyed by a hashable geometry key (and inference mode);
    cleared as a whole when full (a few geometries are live at a time). Copies and pickles of
    the owner start empty: a cache is run-time state, never a module's state."""

    def __init__(self, maxsize=16):
        self.maxsize = maxsize
        self._entries = {}

    def __call__(self, key, build):
        """The table of ``key``: built by ``build()`` on a miss (every call while tracing)."""
        if torch.compiler.is_compiling():
            return build()
        key = (key, torch.is_inference_mode_enabled())
        hit = self._entries.get(key)
        if hit is None:
            if len(self._entries) >= self.maxsize:
                self._entries.clear()
            hit = self._entries[key] = build()
        return hit

    def __len__(self):
        return len(self._entries)

    def clear(self):
        self._entries.clear()

    def __getstate__(self):  # never pickle or deep-copy cached tensors
        return {'maxsize': self.maxsize, '_entries': {}}

    def __setstate__(self, state):
        self.__dict__.update(state)


def geometry_cached(maxsize=64):
    """Decorator: a builder of hashable arguments (integers, tuples, a device) whose tables are
    kept in a :class:`GeometryCache`; ``cache_clear()`` empties it."""
    def wrap(build):
        cache = GeometryCache(maxsize)

        @functools.wraps(build)
        def cached(*args):
            return cache(args, lambda: build(*args))
        cached.cache_clear = cache.clear
        cached.cache = cache
        return cached
    return wrap


def parameter_cache_allowed(*params):
    """Whether tensors derived from the parameters ``params`` (a bias table gathered into a
    mask) may be cached: not while autograd records through them (each call must gather them
    again for their gradients), nor while a compiler traces (the graph holds no cache)."""
    return not (torch.compiler.is_compiling()
                or torch.is_grad_enabled() and any(p.requires_grad for p in params))


def parameter_key(*params):
    """Cache key part that changes whenever a parameter is updated in place, moved or cast (and
    with inference mode, whose tensors autograd cannot save)."""
    return (torch.is_inference_mode_enabled(), ) + tuple(
        (p._version, p.data_ptr(), p.dtype, p.device) for p in params)
