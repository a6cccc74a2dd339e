"""``mmeffvit/utils/allocator.py``: freed CPU memory kept for reuse, so large tensors of the next
step do not fault in fresh pages (each case in a fresh process: the setting is process-wide)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a block-by-block step like a backbone's: large tensors made and freed in turn, then the
# minor page faults of a second step
SCRIPT = '''
import resource, sys
sys.path.insert(0, {root!r})
import torch
from mmeffvit.utils.allocator import retain_freed_memory
applied = retain_freed_memory(default={default})

def step():
    x = torch.ones(1 << 22)
    for _ in range(6):
        y = torch.ones(1 << 24)  # 64 MiB: above glibc's largest mmap threshold
        x = x + y[: x.numel()]
        del y
    return x

step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
'''


def _run(default, env_value=None):
    env = dict(os.environ)
    env.pop('MMEFFVIT_MALLOC', None)
    if env_value is not None:
        env['MMEFFVIT_MALLOC'] = env_value
    proc = subprocess.run([sys.executable, '-c', SCRIPT.format(root=ROOT, default=default)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    applied, faults = proc.stdout.split()
    return applied == 'True', int(faults)


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc only')
def test_second_step_reuses_memory_instead_of_faulting_in_pages():
    applied, faults = _run(default=False, env_value='retain')  # the env overrides default
    system, system_faults = _run(default=True, env_value='system')
    assert applied and not system
    pages = 6 * (64 << 20) // 4096
    assert system_faults > pages // 2  # every 64 MiB block faulted in again
    assert faults < pages // 4  # at most a block or two of new heap


def test_bad_env_value_is_an_error():
    from mmeffvit.ops.policy import from_environment
    with pytest.raises(ValueError, match="MMEFFVIT_MALLOC='jemalloc': expected 'retain' or"):
        from_environment({'MMEFFVIT_MALLOC': 'jemalloc'})
