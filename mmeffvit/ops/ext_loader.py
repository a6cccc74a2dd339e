"""Lazy loading of the compiled operators ``mmeffvit._ext`` and the choice of code path.

The choice follows :func:`mmeffvit.ops.policy.policy` (``MMEFFVIT_OPS``): the references only,
the compiled operators required (an error if they are not built or cannot run on the tensor's
device), or, unset, the compiled CPU operators when they are importable, with a one-time info
log otherwise. The CUDA kernels compile (CI builds them) but have not yet run on a GPU, so unset
means the reference on CUDA tensors until they are verified; ``MMEFFVIT_OPS=1`` opts in.
"""
import logging

from .policy import compiling, extension_error, policy
from .policy import load_extension as load_ext  # noqa: F401 (the ops' name for it)

_MODE_NAMES = {'reference': '0', 'kernels': '1', 'auto': 'auto'}
_logged = False  # the fallback is logged once per process


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
    if mode == '0' or compiling():  # opaque pybind calls to torch.compile and torch.export
        return None
    ext = load_ext()
    if ext is None:
        if mode == '1':
            raise RuntimeError(f'MMEFFVIT_OPS=1 but mmeffvit._ext is not built '
                               f'({extension_error()}); run `python setup.py build_ext --inplace`')
        _log_fallback(f'mmeffvit._ext not built: {extension_error()}')
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
