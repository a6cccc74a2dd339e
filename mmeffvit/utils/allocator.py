"""Keep freed CPU memory for reuse instead of handing it back to the OS (glibc's malloc).

glibc serves every block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and
unmaps it when freed, so each large tensor of a CPU step is faulted in by the kernel page by
page on first write. At detection resolution most activations are that large (a stage-1 map of
800×1333 at 96 channels is 26 MB, its MLP hidden 102 MB), and the faults cost more than the
copies themselves (an ``index_select`` into a new tensor of that size took four times as
long as into a reused one; ``docs/ops.md``). torch's own CPU tuning launcher
(``torch.backends.xeon.run_cpu``) preloads jemalloc or tcmalloc for this reason; this does the
same in-process with ``mallopt``, where no such library is installed: large blocks come from the
heap and freed memory stays mapped for the next step. The resident size then keeps its high
water mark (what a steady training loop reaches anyway).

Inference tools (``tools/test.py``, the benchmark's inference steps) call
:func:`retain_freed_memory` at start. Training does not by default: a training step frees and
reallocates blocks of many sizes, and the retained heap then fragments (a faster step for a
higher peak RSS; ``docs/ops.md``). ``MMEFFVIT_MALLOC=retain`` turns it
on everywhere, ``MMEFFVIT_MALLOC=system`` off everywhere.
"""
import ctypes
import ctypes.util
import sys

from ..ops.policy import policy

ENV = 'MMEFFVIT_MALLOC'
_M_TRIM_THRESHOLD = -1  # malloc.h: bytes of free heap top kept before trimming
_M_MMAP_MAX = -4  # malloc.h: most blocks served by mmap at once (0: none)
_applied = False


def retain_freed_memory(default: bool = True) -> bool:
    """Set glibc's malloc to serve large blocks from the heap and never trim it.

    Args:
        default (bool): Whether to apply it when ``MMEFFVIT_MALLOC`` is unset.

    Returns:
        bool: Whether the setting is in effect (``False`` on non-glibc systems, with
        ``MMEFFVIT_MALLOC=system``, or if ``mallopt`` refused).
    """
    global _applied
    if _applied:
        return True
    choice = policy().malloc  # MMEFFVIT_MALLOC
    wanted = choice == 'retain' or (default and choice == 'default')
    if not wanted or not sys.platform.startswith('linux'):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only (musl's mallopt does nothing)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # the largest int: never trim (a negative value would be read as "use the default")
    _applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    return _applied
