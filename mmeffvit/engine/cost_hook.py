"""The cost of a training run beside its metrics: CPU time per iteration and peak memory.

mmengine logs the wall time of every iteration (``time``) and, on CUDA, the allocated memory
(``memory``). On a CPU machine shared with other jobs the wall time says more about the neighbours
than about the model, and there is no memory figure at all. :class:`IterCostHook` adds, as training
scalars that the logger averages and writes like ``time`` (and that ``vis_data/scalars.json``
keeps):

* ``cpu_time``: CPU seconds the process spent in the iteration, all threads together
  (``time.process_time``): on a busy machine it grows far less than the wall time;
* ``peak_rss_mb``: the process's peak resident memory so far, in MiB (``ru_maxrss``), which holds
  the framework (about a GiB) besides the model's weights, activations and gradients.

Use it with ``custom_imports=dict(imports=['mmeffvit.engine.cost_hook'])`` and
``custom_hooks=[dict(type='IterCostHook')]`` (tools/analysis/learning_table.py and
pretrain_study.py do).
"""
import resource
import sys
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes
    return peak / (1024 * 1024) if sys.platform == 'darwin' else peak / 1024


@HOOKS.register_module()
class IterCostHook(Hook):
    """Log the CPU seconds of each training iteration and the peak resident memory."""

    priority = 'NORMAL'  # before LoggerHook (BELOW_NORMAL) writes the iteration's scalars

    def __init__(self):
        self._start = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._start = time.process_time()

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if self._start is None:
            return
        runner.message_hub.update_scalar('train/cpu_time', time.process_time() - self._start)
        runner.message_hub.update_scalar('train/peak_rss_mb', peak_rss_mb())
