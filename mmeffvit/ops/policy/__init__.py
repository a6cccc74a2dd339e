"""Which code path mmeffvit's operators take: the one reader of the kernel switches.

Every choice of kernel is made from the record :func:`policy` returns, and this module is the
only Python code that reads the kernel-related environment variables and the CPU's instruction
set:

* ``MMEFFVIT_OPS``: ``0`` the pure-PyTorch references everywhere; ``1`` the compiled operators
  required (an error where they are not built or have no kernel for the device); unset
  (``auto``): the compiled CPU operators where built, the references on CUDA tensors until the
  CUDA kernels are verified on a GPU.
* ``MMEFFVIT_LINEAR_KERNEL``: ``onednn`` or ``aten`` forces the GEMM behind the CPU linears and
  the compiled kernels' block products; unset, oneDNN where ATen reports an AVX-512 CPU (its
  fp32 GEMM is the faster one there and the slower one on AVX2, ``docs/ops.md``).
* ``MMEFFVIT_MALLOC``: ``retain`` keeps freed memory for reuse in training too, ``system``
  nowhere; unset, the inference tools keep it (``mmeffvit.utils.allocator``).
* ``MMEFFVIT_TRITON``: ``1`` runs the Triton kernels (:mod:`mmeffvit.ops.triton_kernels`)
  on CUDA tensors (and CPU ones under ``TRITON_INTERPRET=1``); unset or ``0``, not: they are
  opt-in until a GPU run has verified them.

The environment is read once, on first use. Tests and tools change the policy for a block with
:func:`use_reference` / :func:`use_kernels` (as timm's ``set_layer_config``), never through the
environment. Checkpoint trust, launcher and debug variables are not kernel choices and are read
where they are used. ``python -m mmeffvit.ops.policy`` prints the policy in force and why.

Example:
    >>> from mmeffvit.ops.policy import policy, use_reference
    >>> with use_reference():
    ...     policy().mode
    'reference'
"""
import contextlib
import dataclasses
import functools
import importlib
import os
import threading

import torch

CPU_GEMMS = ('onednn', 'aten')
#: the C++ kernels' block-product GEMM that goes with each GEMM of the CPU linears
KERNEL_GEMM_OF_CPU_GEMM = {'onednn': 'brgemm', 'aten': 'blas'}
#: whether this torch has oneDNN's fused linear kernel (without it the CPU GEMM is ATen's)
ONEDNN_LINEAR = (torch.backends.mkldnn.is_available()
                 and hasattr(torch.ops.mkldnn, '_linear_pointwise'))
_OPS_VALUES = {'0': 'reference', '': 'auto', 'auto': 'auto', '1': 'kernels'}
_MALLOC_VALUES = {'': 'default', 'retain': 'retain', 'system': 'system'}
_TRITON_VALUES = {'': False, '0': False, '1': True}
_VARIABLES = ('MMEFFVIT_OPS', 'MMEFFVIT_LINEAR_KERNEL', 'MMEFFVIT_MALLOC', 'MMEFFVIT_TRITON')


@dataclasses.dataclass(frozen=True)
class KernelPolicy:
    """The choice every kernel decision follows.

    Attributes:
        mode (str): ``'reference'`` (PyTorch references only), ``'auto'`` (compiled kernels
            where built and verified for the device) or ``'kernels'`` (compiled kernels
            required).
        cpu_gemm (str): The GEMM of the CPU linears: ``'onednn'`` (``mkldnn::_linear_pointwise``,
            and oneDNN's brgemm for the compiled kernels' block products) or ``'aten'``
            (``F.linear``, the BLAS torch links).
        cpu_gemm_forced (bool): Whether ``MMEFFVIT_LINEAR_KERNEL`` chose it (else the ISA did).
        malloc (str): ``'default'``, ``'retain'`` or ``'system'`` (``MMEFFVIT_MALLOC``).
        cpu_capability (str): ATen's CPU capability (``'AVX512'``, ``'AVX2'``, ...).
        triton (bool): Whether the Triton kernels (:mod:`mmeffvit.ops.triton_kernels`) run
            where they can: on CUDA tensors, real or fake, and on CPU tensors under Triton's
            interpreter (opt-in, ``MMEFFVIT_TRITON=1`` or :func:`use_kernels`, until verified
            on a GPU).
    """
    mode: str
    cpu_gemm: str
    cpu_gemm_forced: bool
    malloc: str
    cpu_capability: str
    triton: bool = False

    @property
    def reference(self) -> bool:
        """Whether every operator runs its PyTorch reference."""
        return self.mode == 'reference'

    @property
    def cuda_kernels(self) -> bool:
        """Whether the compiled kernels may run on CUDA tensors (only when required: they are
        compiled in CI but not yet verified on a GPU)."""
        return self.mode == 'kernels'

    @property
    def kernel_gemm(self) -> str:
        """The compiled kernels' block-product GEMM (``_ext.set_cpu_gemm``): the one that goes
        with a forced ``cpu_gemm``, else ``'auto'`` (the same AVX-512 rule, in C++)."""
        return KERNEL_GEMM_OF_CPU_GEMM[self.cpu_gemm] if self.cpu_gemm_forced else 'auto'

    def ops_for(self, device_type: str) -> str:
        """``'reference'`` or ``'compiled'``: what the operators run on tensors of a device
        type (``'compiled'`` where ``mmeffvit._ext`` is built and has the device's kernels)."""
        if self.reference or (device_type == 'cuda' and not self.cuda_kernels):
            return 'reference'
        return 'compiled' if device_type in ('cpu', 'cuda') else 'reference'


@functools.lru_cache(maxsize=None)
def cpu_capability() -> str:
    """ATen's CPU capability, read once (``'AVX512'``, ``'AVX2'``, ``'DEFAULT'``, ...)."""
    return torch.backends.cpu.get_cpu_capability()


def choose_cpu_gemm(capability, override=''):
    """``'onednn'`` on an AVX-512 CPU, ``'aten'`` elsewhere or where this torch has no oneDNN
    linear kernel; ``override`` (``MMEFFVIT_LINEAR_KERNEL``) wins where it can run."""
    if override and override not in CPU_GEMMS:
        raise ValueError(f'MMEFFVIT_LINEAR_KERNEL={override!r}: expected one of {CPU_GEMMS}')
    choice = override or ('onednn' if capability.startswith('AVX512') else 'aten')
    return choice if ONEDNN_LINEAR else 'aten'  # a torch without the kernel has one choice


def from_environment(environ) -> KernelPolicy:
    """The policy a mapping of environment variables asks for (``os.environ`` on first use)."""
    ops = environ.get('MMEFFVIT_OPS', '').strip().lower()
    linear_kernel = environ.get('MMEFFVIT_LINEAR_KERNEL', '').strip()
    malloc = environ.get('MMEFFVIT_MALLOC', '').strip().lower()
    triton = environ.get('MMEFFVIT_TRITON', '').strip()
    if ops not in _OPS_VALUES:
        raise ValueError(f'MMEFFVIT_OPS must be 0, 1 or unset, got {ops!r}')
    if malloc not in _MALLOC_VALUES:
        raise ValueError(f"MMEFFVIT_MALLOC={malloc!r}: expected 'retain' or 'system'")
    if triton not in _TRITON_VALUES:
        raise ValueError(f'MMEFFVIT_TRITON must be 0, 1 or unset, got {triton!r}')
    capability = cpu_capability()
    return KernelPolicy(mode=_OPS_VALUES[ops],
                        cpu_gemm=choose_cpu_gemm(capability, linear_kernel),
                        cpu_gemm_forced=bool(linear_kernel), malloc=_MALLOC_VALUES[malloc],
                        cpu_capability=capability, triton=_TRITON_VALUES[triton])


_lock = threading.Lock()
_environment = []  # the environment's policy, once read
# the blocks of use_reference / use_kernels, innermost last; process-wide, not per thread:
# autograd runs backward on its own threads, which must see the forward's choice
_overrides = []


def policy() -> KernelPolicy:
    """The policy in force: the innermost :func:`use_reference` / :func:`use_kernels` block,
    else the environment's (read once)."""
    if _overrides:
        return _overrides[-1]
    return _environment_policy()


@torch.compiler.assume_constant_result  # run, not traced, by torch.compile: a constant there
def _environment_policy():
    if not _environment:
        with _lock:
            if not _environment:
                _environment.append(from_environment(os.environ))
    return _environment[0]


def exporting() -> bool:
    """Whether ``torch.export`` (and with it ``torch.onnx.export(dynamo=True)``) is tracing."""
    return torch.compiler.is_exporting()


def compiling() -> bool:
    """Whether ``torch.compile`` or ``torch.export`` is tracing the caller. The operators then
    run their references (the compiler fuses and plans memory itself; the compiled CPU kernels
    are opaque to it) and per-shape caches are bypassed, their tables traced as graph
    constants (or symbolic expressions under dynamic shapes)."""
    return torch.compiler.is_compiling()


@contextlib.contextmanager
def _override(new):
    ext = load_extension()
    _overrides.append(new)
    gemm_before = apply_to_extension(ext, new)
    try:
        yield new
    finally:
        # by identity: an equal policy deeper in the stack is another block's
        del _overrides[max(i for i, entry in enumerate(_overrides) if entry is new)]
        if gemm_before is not None:
            ext.set_cpu_gemm(gemm_before)


def use_reference():
    """Inside the block every operator runs its PyTorch reference (as ``MMEFFVIT_OPS=0``).

    Example:
        >>> from mmeffvit.ops.policy import policy, use_reference
        >>> with use_reference():
        ...     policy().ops_for('cpu')
        'reference'
    """
    return _override(dataclasses.replace(policy(), mode='reference', triton=False))


def use_kernels(required=True, cpu_gemm=None, triton=None):
    """Inside the block the compiled kernels run; nestable, the previous policy and the C++
    GEMM state restored on exit.

    Args:
        required (bool): An error where a kernel is not built or has no kernel for the device
            (as ``MMEFFVIT_OPS=1``); False: where built, as ``auto``.
        cpu_gemm (str, optional): ``'onednn'`` or ``'aten'``: the GEMM of the CPU linears and,
            with it, of the kernels' block products (as ``MMEFFVIT_LINEAR_KERNEL``); default
            unchanged.
        triton (bool, optional): True: the Triton kernels where they can run (CUDA tensors,
            fake ones included, and CPU tensors under ``TRITON_INTERPRET=1``); ``required``
            then governs the other operators (``use_kernels(False, triton=True)`` counts a
            CUDA forward on fake tensors: Triton there, references elsewhere). Default
            unchanged.
    """
    changes = dict(mode='kernels' if required else 'auto')
    if triton is not None:
        changes.update(triton=bool(triton))
    if cpu_gemm is not None:
        changes.update(cpu_gemm=choose_cpu_gemm('', cpu_gemm), cpu_gemm_forced=True)
    return _override(dataclasses.replace(policy(), **changes))


_extension = []  # [module or None, the ImportError or None], once imported
_extension_lock = threading.Lock()  # not _lock: handing over the GEMM reads the policy


def load_extension():
    """The compiled module ``mmeffvit._ext`` with the policy's GEMM handed to it, or None when
    it is not built (imported once; :func:`mmeffvit.ops.load_ext`)."""
    if not _extension:
        with _extension_lock:
            if not _extension:
                try:
                    ext, error = importlib.import_module('mmeffvit._ext'), None
                except ImportError as err:  # not built (or built for another torch)
                    ext, error = None, err
                else:  # the kernels' block products on the policy's GEMM
                    apply_to_extension(ext)
                _extension.extend((ext, error))
    return _extension[0]


def extension_error():
    """Why :func:`load_extension` found no compiled module (None if it did or was not asked)."""
    return _extension[1] if _extension else None


def apply_to_extension(ext, current=None):
    """Hand the policy's block-product GEMM to the compiled kernels (``ext.set_cpu_gemm``);
    returns the previous C++ setting, or None where the extension has no such switch."""
    if ext is None or not hasattr(ext, 'set_cpu_gemm'):
        return None
    return ext.set_cpu_gemm((current or policy()).kernel_gemm)


def describe(current=None) -> str:
    """The policy, what was detected and why, as printed by ``python -m mmeffvit.ops.policy``."""
    p = current or policy()
    raw = {name: os.environ.get(name, '') for name in _VARIABLES}
    shown = {name: f'{name}={value}' if value else f'{name} unset' for name, value in raw.items()}
    ext = load_extension()
    built = 'not built' if ext is None else (
        'built, with CUDA kernels' if ext.compiled_with_cuda() else 'built, CPU kernels only')
    ops_why = {'reference': 'the PyTorch references everywhere',
               'auto': 'compiled CPU kernels where built; references on CUDA tensors (the CUDA '
                       'kernels are not yet verified on a GPU)',
               'kernels': 'compiled kernels required on CPU and CUDA tensors'}[p.mode]
    gemm_why = (shown['MMEFFVIT_LINEAR_KERNEL'] if p.cpu_gemm_forced
                else f"ATen reports {p.cpu_capability}: oneDNN's fp32 GEMM on AVX-512, "
                     "ATen's BLAS elsewhere")
    if not ONEDNN_LINEAR:
        gemm_why += "; this torch has no oneDNN linear kernel"
    malloc_why = {'default': 'freed memory kept for reuse by the inference tools, glibc\'s '
                             'defaults in training',
                  'retain': 'freed memory kept for reuse in training and inference',
                  'system': "glibc's defaults everywhere"}[p.malloc]
    rows = [('operators', p.mode, f"{shown['MMEFFVIT_OPS']}: {ops_why}"),
            ('  on cpu', p.ops_for('cpu'), ''),
            ('  on cuda', p.ops_for('cuda'), ''),
            ('Triton', 'on' if p.triton else 'off',
             'Triton kernels on CUDA tensors (and CPU ones under TRITON_INTERPRET=1)'
             if p.triton else 'opt-in (MMEFFVIT_TRITON=1, use_kernels(triton=True)): not yet '
             'verified on a GPU'),
            ('extension', 'mmeffvit._ext', built),
            ('CPU GEMM', p.cpu_gemm, gemm_why),
            ("kernels' GEMM", p.kernel_gemm,
             "the compiled kernels' block products" + (
                 '' if p.cpu_gemm_forced else ': brgemm on AVX-512, BLAS elsewhere (in C++)')),
            ('allocator', p.malloc, f"{shown['MMEFFVIT_MALLOC']}: {malloc_why}")]
    lines = [f'mmeffvit kernel policy: {p}']
    lines += [f'  {name:<14} {value:<10} {why}'.rstrip() for name, value, why in rows]
    return '\n'.join(lines)
