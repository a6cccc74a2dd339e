"""Lazy loading of the compiled operators ``mmeffvit._ext`` and the choice of code path.

``MMEFFVIT_OPS`` forces the path: ``0`` always uses the pure-PyTorch references, ``1`` requires
the compiled operators (an error if they are not built or cannot run on the tensor's device);
unset, the compiled CPU operators are used when they are importable, with a one-time info log
otherwise. The CUDA kernels compile (CI builds them) but have not yet run on a GPU, so unset
means the reference on CUDA tensors until they are verified; ``MMEFFVIT_OPS=1`` opts in.
"""
import importlib
import logging
import os

_UNSET = object()
_ext = _UNSET
_error = None
_logged = False


# MMEFFVIT_LINEAR_KERNEL (mmeffvit.models.layers.linear) also picks the GEMM of the compiled CPU
# kernels' block products: oneDNN's brgemm or the BLAS library (the default follows the same
# AVX-512 rule in C++)
_CPU_GEMM_OF_LINEAR_KERNEL = {'onednn': 'brgemm', 'aten': 'blas'}


def load_ext():
    """The ``mmeffvit._ext`` module, or None when it is not built (imported once)."""
    global _ext, _error
    if _ext is _UNSET:
        try:
            _ext = importlib.import_module('mmeffvit._ext')
        except ImportError as err:  # not built (or built for another torch)
            _ext, _error = None, err
        else:
            forced = os.environ.get('MMEFFVIT_LINEAR_KERNEL', '')
            if forced in _CPU_GEMM_OF_LINEAR_KERNEL and hasattr(_ext, 'set_cpu_gemm'):
                _ext.set_cpu_gemm(_CPU_GEMM_OF_LINEAR_KERNEL[forced])
    return _ext


def ops_mode():
    """``'0'``, ``'1'`` or ``'auto'`` from ``MMEFFVIT_OPS`` (read at every call: tests flip it)."""
    mode = os.environ.get('MMEFFVIT_OPS', 'auto').strip().lower()
    if mode not in ('0', '1', 'auto', ''):
        raise ValueError(f"MMEFFVIT_OPS must be 0, 1 or unset, got {mode!r}")
    return mode or 'auto'


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
