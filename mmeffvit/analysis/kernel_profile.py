"""The kernels one step of a backbone launches, from ``torch.profiler``, beside the counter's.

:func:`profile_kernels` is a job of :mod:`mmeffvit.analysis.benchmark_worker` (kind
``'kernels'``, run in a child process by ``tools/analysis/profile_gpu.py``): warm-up steps, one
step timed by CUDA events (``perf_counter`` on the CPU), one step under the profiler. On CUDA
it lists the device kernels (launches and device time by kernel name); on the CPU, where there
are no kernels, the ATen operators that would launch them (self CPU time), so the tool runs
and is tested without a GPU. Beside them: the kernel counter's number for the same backbone,
input and mode (:func:`mmeffvit.analysis.kernel_count.count_backbone`, fake CUDA tensors, one
forward), which calibrates the counter against what a GPU runs.
"""
import time
from collections import defaultdict

import torch

from .backbone_step import backbone_step, build_case, sync
from .kernel_count import count_backbone


def _shorter(name, width=90):
    """A kernel's name cut to ``width`` characters (templated CUDA names run to thousands)."""
    return name if len(name) <= width else name[:width - 1] + '…'


def _launched(prof, device):
    """``name -> [launches, µs]``: device kernels on CUDA, ATen operators' self time on CPU."""
    table = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if device.type == 'cuda':
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = event.device_time_total
        else:
            if not event.name.startswith('aten::') or event.cpu_children:
                continue  # composite operators: their children are counted
            us = event.self_cpu_time_total
        entry = table[_shorter(event.name)]
        entry[0] += 1
        entry[1] += us
    return table


def profile_kernels(job, opts):
    """One case (``job``: ``case``, ``shape``, ``batch``, ``mode``, ``warmup``) on
    ``opts['device']`` in ``opts['dtype']`` (autocast) with ``opts['optimizer']``.

    Returns the step time (ms, unprofiled), the kernels launched in the profiled step and their
    time (total and the ``top`` 15 by time), and the counter's forward count in fp32 and the
    step's dtype.
    """
    device, dtype = torch.device(opts['device']), getattr(torch, opts['dtype'])
    train = job['mode'] == 'train'
    model = build_case(job['case']).to(device).train(train)
    x = torch.randn(job.get('batch', 1), 3, *job['shape'],
                    generator=torch.Generator().manual_seed(0)).to(device)
    step = backbone_step(model, model, x, job['mode'], device, dtype, opts.get('optimizer'))
    for _ in range(max(1, job.get('warmup', 2))):  # Triton compiles, caches fill
        step()
    sync(device)
    if device.type == 'cuda':
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        step_ms = start.elapsed_time(end)
    else:
        t0 = time.perf_counter()
        step()
        step_ms = (time.perf_counter() - t0) * 1e3
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == 'cuda':
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step()
        sync(device)
    table = _launched(prof, device)
    top = sorted(((n, c, us) for n, (c, us) in table.items()), key=lambda t: -t[2])[:15]
    counted = {}
    for counted_dtype in dict.fromkeys((torch.float32, dtype)):
        count = count_backbone(build_case(job['case']), tuple(job['shape']), x.shape[0],
                               counted_dtype, train)
        counted[str(counted_dtype).split('.')[-1]] = count.kernels
    return dict(step_ms=step_ms, launches=sum(c for c, _ in table.values()),
                kernel_us=sum(us for _, us in table.values()), top=top, counter=counted,
                kind='CUDA kernels' if device.type == 'cuda' else 'ATen operators (CPU)')
