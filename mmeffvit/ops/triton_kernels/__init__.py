"""Triton kernels behind the :mod:`mmeffvit.ops` entry points, as ``torch.library`` custom ops.

Each kernel pair (forward, backward) is one custom op with a fake implementation and an
autograd formula (:mod:`.custom_ops`), so ``torch.compile`` and the kernel counter see one op and
fake tensors never reach Triton. Nothing here imports Triton before an entry point asks for a
kernel, and asking touches no GPU driver: Triton is imported, never initialised, until a real
launch. The kernels run on CUDA tensors, and on CPU tensors when Triton's interpreter is on
(``TRITON_INTERPRET=1``, how CI tests them).
"""
import importlib

import torch

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


_loaded = []  # [the custom_ops module or None], once imported


@torch.compiler.assume_constant_result  # run, not traced, by torch.compile: a constant there
def available():
    """Whether Triton is installed; imports :mod:`.custom_ops` once, which registers the ops."""
    if not _loaded:
        try:
            _loaded.append(importlib.import_module(f'{__name__}.custom_ops'))
        except ImportError:  # a torch without Triton (CPU-only wheels of some platforms)
            _loaded.append(None)
    return _loaded[0] is not None


@torch.compiler.assume_constant_result
def interpreted():
    """Whether Triton runs its CPU interpreter (``TRITON_INTERPRET=1``: Triton's own switch)."""
    return available() and _loaded[0].interpreting()


def registered_ops():
    """The registered ops' module (:mod:`.custom_ops`); ImportError where Triton is not
    installed."""
    if not available():
        raise ImportError('the Triton kernels need the triton package (it ships with CUDA builds '
                          'of torch)')
    return _loaded[0]


def runs_on(*tensors):
    """Whether the Triton kernels can take these tensors: CUDA tensors (real or fake), or CPU
    tensors under Triton's interpreter."""
    devices = {t.device.type for t in tensors}
    if devices == {'cuda'}:
        return available()
    return devices == {'cpu'} and interpreted()


def selected(*tensors):
    """Whether an entry point runs its Triton kernel on ``tensors``: the policy asks for Triton
    (:func:`mmeffvit.ops.use_kernels` with ``triton=True``), the tensors are fp32 / bf16 / fp16
    on a device Triton can take (:func:`runs_on`), and no ``torch.export`` is tracing (ONNX has
    no translation of the ops: the references export)."""
    from ..policy import exporting, policy  # not at import: the policy package imports ops
    current = policy()
    return (current.triton and not current.reference and not exporting()
            and all(t.dtype in _DTYPES for t in tensors) and runs_on(*tensors))


def cost(name, args):
    """``(kernel launches, FLOPs)`` of a call of the op ``name`` (``'mmeffvit.<op>'``) with
    ``args``, None for an op not registered here."""
    if not available() or name not in _loaded[0].COSTS:
        return None
    return _loaded[0].COSTS[name](*args)
