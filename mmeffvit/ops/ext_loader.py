"""Lazy loading of the compiled operators ``mmeffvit._ext`` and the choice of code path.

The choice follows :func:`mmeffvit.ops.policy.policy` (``MMEFFVIT_OPS``): the references only,
the compiled operators required (an error if they are not built or cannot run on the tensor's
device), or, unset, the compiled CPU operators when they are importable, with a one-time info
log otherwise. The CUDA kernels compile (CI builds them) but have not yet run on a GPU, so unset
means the reference on CUDA tensors until they are verified; ``MMEFFVIT_OPS=1`` opts in.
"""
import importlib
import logging

from .policy import apply_to_extension, policy

_UNSET = object()
_ext = _UNSET
_error = None
_logged = False


def load_ext():
    """The ``mmeffvit._ext`` module, or None when it is not built (imported once)."""
    global _ext, _error
    if _ext is _UNSET:
        try:
            _ext = importlib.import_module('mmeffvit._ext')
        except ImportError as err:  # not built (or built for another torch)
            _ext, _error = None, err
        else:  # the kernels' block products on the policy's GEMM
            apply_to_extension(_ext)
    return _ext


_MODE_NAMES = {'reference': '0', 'kernels': '1', 'auto': 'auto'}


def ops_mode():
    """``'0'``, ``'1'`` or ``'auto'``: the policy's mode as ``MMEFFVIT_OPS`` spells it."""
    return _MODE_NAMES[policy().mode]


def _log_fallback(reason):
    global _logged
    if not _logged:
        _logged = True
        from mmengine.logging import print_log
        print_log(f'mmeffvit ops: using the PyTorch reference ({reason}); build the C++/CUDA '
                  'operators with `python setup.py build_ext --inplace`', logger='current',
                  level=logging.INFO)


def get_ext(*tensors):
    """The compiled module if the ops should run on ``tensors``, else None (reference path)."""
    mode = ops_mode()
    if mode == '0':
        return None
    ext = load_ext()
    if ext is None:
        if mode == '1':
            raise RuntimeError(f'MMEFFVIT_OPS=1 but mmeffvit._ext is not built ({_error}); run '
                               '`python setup.py build_ext --inplace`')
        _log_fallback(f'mmeffvit._ext not built: {_error}')
        return None
    for t in tensors:
        dev = t.device.type
        if dev == 'cuda' and mode == 'auto':
            _log_fallback('CUDA kernels not yet verified on a GPU; MMEFFVIT_OPS=1 opts in')
            return None
        if dev == 'cuda' and not ext.compiled_with_cuda() or dev not in ('cpu', 'cuda'):
            if mode == '1':
                raise RuntimeError(f'MMEFFVIT_OPS=1 but mmeffvit._ext cannot run on {t.device} '
                                   '(rebuild with FORCE_CUDA=1 for CUDA)')
            _log_fallback(f'mmeffvit._ext has no kernels for {t.device}')
            return None
    return ext
