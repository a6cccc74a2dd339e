"""What one child process of ``tools/analysis/benchmark.py`` measures.

Every function here runs in a process of its own, forked from a server that imported torch,
mmdet and mmeffvit but never ran a tensor operation (so the OpenMP pool and CUDA start fresh in
each child). A child receives a list of jobs, measures them in order and sends back one result
dict per job: times in seconds, memory in bytes, or ``error`` with the exception text.

Memory:

* ``alloc_peak``: the most memory torch's allocator held during one step, weights, buffers and
  the input included. CUDA: ``torch.cuda.max_memory_allocated``. CPU: torch keeps no statistics,
  so one step runs under ``torch.profiler`` with ``profile_memory=True``; every allocation and
  free is an event with its size, and the peak of their running sum is added to the bytes that
  were live before the step (parameters, buffers, input). Buffers that BLAS or oneDNN allocate
  themselves are not torch allocations and are missing from this number.
* ``rss_peak``: ``ru_maxrss`` of the child, its resident-set high-water mark (imports included);
  a measure of its own only when the child ran this one job (``--isolate measurement``).
"""
import math
import os
import resource
import statistics
import time
import traceback
from collections import Counter, defaultdict

import numpy as np
import torch

from ..utils.allocator import retain_freed_memory
from .backbone_step import autocast as _autocast
from .backbone_step import backbone_step as _backbone_step
from .backbone_step import build_case, quiet as _quiet, time_once as _time_once
from .kernel_profile import profile_kernels


def _set_threads(threads):
    if threads:
        torch.set_num_threads(threads)


def _rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def _max_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _walk(nodes):
    for node in nodes:
        yield node
        yield from _walk(node.children)


def profiled_alloc_peak(fn):
    """Peak bytes allocated by torch's CPU allocator during ``fn`` above what was live before.

    Frees are events with a negative size; the running sum in time order is the live memory.
    Blocks allocated before and freed during ``fn`` have no event (torch warns about them), so
    the peak can only be overestimated by them, never missed.
    """
    with _quiet(2), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    alloc = torch._C._profiler._EventType.Allocation
    tree = prof.profiler.kineto_results.experimental_event_tree()
    events = sorted((e for e in _walk(tree) if e.tag == alloc), key=lambda e: e.start_time_ns)
    live = peak = 0
    for event in events:
        live += event.extra_fields.alloc_size
        peak = max(peak, live)
    return peak


def _tensor_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is not None and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def _measure(step, device, warmup, reps, static_bytes, before_profile=None):
    """Warm-up, timed repetitions and the memory peaks of one step closure.

    ``before_profile`` frees what an earlier step left (gradients) before the profiled step, so
    that its frees, which the profiler cannot see, do not inflate the peak.
    """
    result = {}
    if device.type == 'cuda':
        for _ in range(warmup):
            step()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        result['times'] = [_time_once(step, device) for _ in range(reps)]
        result['alloc_peak'] = torch.cuda.max_memory_allocated(device)
        result['rss_peak'] = _max_rss_bytes()
        return result
    # CPU: the first warm-up runs under the memory profiler (its slowness is not timed); without
    # a warm-up the profiled step comes after the timed ones and after reading the RSS peak
    peak = None
    for i in range(warmup):
        if i == 0:
            peak = profiled_alloc_peak(step)
        else:
            step()
    result['times'] = [_time_once(step, device) for _ in range(reps)]
    result['rss_peak'] = _max_rss_bytes()
    if peak is None:
        if before_profile is not None:
            before_profile()
        peak = profiled_alloc_peak(step)
    result['alloc_peak'] = static_bytes + peak
    return result


def measure_backbone(job, opts):
    device, dtype = torch.device(opts['device']), getattr(torch, opts['dtype'])
    model = build_case(job['case']).to(device)
    model.train(job['mode'] == 'train')
    run = torch.compile(model) if opts.get('compile') else model
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(job.get('batch', 1), 3, *job['shape'], generator=generator).to(device)
    static = _tensor_bytes(list(model.parameters()) + list(model.buffers()) + [x])
    rss_base = _rss_bytes()
    step = _backbone_step(model, run, x, job['mode'], device, dtype, opts.get('optimizer'))
    result = _measure(step, device,
                      job['warmup'], job['reps'], static,
                      before_profile=lambda: model.zero_grad(set_to_none=True))
    result.update(params=sum(p.numel() for p in model.parameters()), rss_base=rss_base)
    return result


def _gemm_kernels(a, b, out):
    """The fp32 GEMMs a CPU step may run, by name: torch's (``torch.mm``, MKL on x86) and
    oneDNN's linear kernel where torch has it. They differ widely on some CPUs (``docs/ops.md``),
    so the machine's rate is the faster one."""
    kernels = {'torch.mm': lambda: torch.mm(a, b, out=out)}
    if a.device.type == 'cpu' and a.dtype == torch.float32:
        from mmeffvit.ops.policy import ONEDNN_LINEAR
        if ONEDNN_LINEAR:
            linear = torch.ops.mkldnn._linear_pointwise
            kernels['oneDNN'] = lambda: linear(a, b, None, 'none', [], '')
    return kernels


def measure_gemm(job, opts):
    """Seconds of ``n×n @ n×n`` products by each available kernel (:func:`_gemm_kernels`); the
    rate is ``n³`` multiply-adds over the time. ``times`` are the fastest kernel's."""
    device, dtype = torch.device(opts['device']), getattr(torch, job.get('dtype', 'float32'))
    n = job['n']
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(device, dtype)
    b = torch.randn(n, n, generator=generator).to(device, dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    by_kernel = {}
    for name, fn in _gemm_kernels(a, b, out).items():
        fn()  # warm-up
        by_kernel[name] = [_time_once(fn, device) for _ in range(job['reps'])]
    kernel = min(by_kernel, key=lambda k: min(by_kernel[k]))
    times = by_kernel[kernel]
    return dict(times=times, macs=n ** 3, gmacs_per_s=n ** 3 / min(times) / 1e9,
                gmacs_per_s_median=n ** 3 / statistics.median(times) / 1e9, kernel=kernel,
                kernel_times=by_kernel)


def _complexity():
    """The project's MAC counter, where it lives now or after the move to mmeffvit.analysis."""
    try:
        from mmeffvit.analysis import complexity
    except ImportError:
        from mmeffvit.utils import complexity
    return complexity


def count_macs(job, opts):
    """Forward GMACs of a case at one shape (traced on the CPU, fp32, eval mode)."""
    model = build_case(job['case'])
    model.eval()
    x = torch.randn(1, 3, *job['shape'], generator=torch.Generator().manual_seed(0))
    report = _complexity().analyze(model, x)
    return dict(macs=int(report.macs), params=int(report.params),
                unsupported_ops=dict(report.unsupported_ops))


def machine_info(job, opts):
    import platform
    info = dict(torch=torch.__version__, threads=torch.get_num_threads(),
                python=platform.python_version(), numpy=np.__version__)
    for name in ('mmengine', 'mmcv', 'mmdet', 'mmseg'):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001  a missing toolbox is reported as such
            info[name] = 'not installed'
    try:
        from mmeffvit import ops
        info['mmeffvit_ops'] = 'compiled' if ops.load_ext() is not None else 'not built'
    except Exception as err:  # noqa: BLE001
        info['mmeffvit_ops'] = f'unavailable ({err})'
    from mmeffvit.ops.policy import policy
    info['cpu_capability'] = policy().cpu_capability
    info['linear_kernel'] = policy().cpu_gemm  # chosen by the ISA: runs differ by machine
    info['triton'] = policy().triton
    if opts['device'].startswith('cuda'):
        props = torch.cuda.get_device_properties(0)
        info['gpu'] = f'{props.name}, {props.total_memory / 2**30:.0f} GiB'
        info['cuda'] = torch.version.cuda
    return info


# --- detectors and segmentors from a config ----------------------------------------------------

def _synthetic_batch(scope, shape, batch):
    """``batch`` shapes images (mmeffvit.datasets.shapes) resized to ``shape`` with their labels."""
    import cv2
    from mmengine.structures import InstanceData, PixelData

    from mmeffvit.datasets.shapes import render_image, semantic_label
    rng = np.random.default_rng(0)
    h, w = shape
    inputs, samples = [], []
    for _ in range(batch):
        image, instances = render_image(rng, min(h, w), min(h, w))
        image = cv2.resize(image, (w, h), interpolation=cv2.INTER_LINEAR)
        masks = [cv2.resize(m.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST)
                 for _, m in instances]
        meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), scale_factor=(1., 1.),
                    flip=False, flip_direction=None, img_id=len(samples))
        inputs.append(torch.from_numpy(image).permute(2, 0, 1).contiguous())
        if scope == 'mmseg':
            from mmseg.structures import SegDataSample
            visible = [(c, m.astype(bool)) for (c, _), m in zip(instances, masks)]
            label = semantic_label((h, w), visible).astype(np.int64) - 1
            label[label < 0] = 255  # ADE's reduce_zero_label: unlabeled → ignore index
            sample = SegDataSample(metainfo=meta)
            sample.gt_sem_seg = PixelData(data=torch.from_numpy(label)[None])
        else:
            from mmdet.structures import DetDataSample
            from mmdet.structures.bbox import HorizontalBoxes
            from mmdet.structures.mask import BitmapMasks
            boxes = []
            for m in masks:
                ys, xs = np.nonzero(m)
                boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
            sample = DetDataSample(metainfo=meta)
            sample.gt_instances = InstanceData(
                bboxes=HorizontalBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)),
                labels=torch.tensor([c for c, _ in instances], dtype=torch.long),
                masks=BitmapMasks(np.stack(masks) if masks else np.zeros((0, h, w), np.uint8),
                                  h, w))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _build_from_config(path, device):
    import copy

    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS, DefaultScope, init_default_scope
    cfg = Config.fromfile(path)
    scope = cfg.get('default_scope', 'mmdet')
    init_default_scope(scope)
    model_cfg = copy.deepcopy(cfg.model)
    if isinstance(model_cfg.get('backbone'), dict):
        model_cfg['backbone']['init_cfg'] = None  # random weights: no checkpoint to load
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(model_cfg)
    # SyncBN needs a process group; one process trains plain BatchNorm at the same cost
    return cfg, scope, revert_sync_batchnorm(model).to(device)


def measure_detector(job, opts):
    """Seconds of ``model.test_step`` (eval, no grad) or ``model.train_step`` (one update)."""
    device = torch.device(opts['device'])
    cfg, scope, model = _build_from_config(job['config'], device)
    data = _synthetic_batch(scope, job['shape'], job['batch'])
    static = _tensor_bytes(list(model.parameters()) + list(model.buffers()))
    dtype = getattr(torch, opts['dtype'])
    if job['mode'] == 'test':
        model.eval()

        def step():
            with torch.no_grad(), _autocast(device, dtype):
                model.test_step(data)
    else:
        from mmengine.optim import build_optim_wrapper
        optim_cfg = dict(cfg.optim_wrapper)
        if dtype != torch.float32:
            optim_cfg.update(type='AmpOptimWrapper', dtype=opts['dtype'])
        optim_wrapper = build_optim_wrapper(model, optim_cfg)
        model.train()

        def step():
            model.train_step(data, optim_wrapper)
    rss_base = _rss_bytes()
    result = _measure(step, device, job['warmup'], job['reps'], static)
    result.update(params=sum(p.numel() for p in model.parameters()), rss_base=rss_base,
                  scope=scope)
    return result


# --- where the time goes (tools/analysis/profile_backbone.py) --------------------------------

#: operators that make the host wait for a tensor's value (a device sync on a GPU)
SYNC_OPS = ('aten::item', 'aten::is_nonzero', 'aten::_local_scalar_dense')
#: operators that copy or rearrange memory rather than compute
COPY_OPS = ('aten::copy_', 'aten::contiguous', 'aten::clone', 'aten::cat', 'aten::roll',
            'aten::unfold', 'aten::gather', 'aten::index', 'aten::index_put_',
            'aten::constant_pad_nd', 'aten::repeat', 'aten::im2col', 'aten::col2im',
            'aten::masked_fill', 'aten::masked_fill_', 'aten::where')
#: leaf GEMM kernels and the positions of their two matrix operands
GEMM_OPERANDS = {'aten::mm': (0, 1), 'aten::addmm': (1, 2), 'aten::bmm': (0, 1),
                 'aten::baddbmm': (1, 2), 'mkldnn::_linear_pointwise': (0, 1)}


def _gemm_macs(name, shapes):
    """Multiply-adds of one GEMM kernel call from its recorded input shapes (None if unknown)."""
    i, j = GEMM_OPERANDS[name]
    try:
        a, b = shapes[i], shapes[j]
        if name == 'mkldnn::_linear_pointwise':  # x (..., K) times weight (O, K)ᵀ
            return math.prod(a) * b[0]
        batch = a[0] if len(a) == 3 else 1
        return batch * a[-2] * a[-1] * b[-1]
    except (IndexError, TypeError):
        return None


def _python_owner(node):
    """``file(line): function`` of the innermost model-code frame above a profiler event.

    Frames of torch itself, of the profiler and module ``__call__`` plumbing are skipped, so a
    ``Linear`` is charged to the function that called it. The line is the function's ``def``.
    """
    parent = node.parent
    while parent is not None:
        name = parent.name
        if str(parent.tag).endswith('PyCall') and not name.startswith(
                ('torch/', 'nn.Module:', '<built-in', 'mmengine/', 'contextlib.py')):
            return name
        parent = parent.parent
    return None


def _memory_at_peak(tree):
    """Bytes live at the allocator peak of a profiled step, by the code that allocated them.

    Replays the allocation / free events (``profile_memory``) in time order; blocks allocated
    before the step are not seen. Returns the peak and ``[(owner, bytes)]`` with the owner as in
    the operator attribution (issuing Python function, or the backward node).
    """
    def walk(nodes):
        for node in nodes:
            yield node
            yield from walk(node.children)
    events = sorted((n for n in walk(tree) if str(n.tag).endswith('Allocation')),
                    key=lambda n: n.start_time_ns)
    live = peak = peak_index = 0
    for i, node in enumerate(events):
        live += node.extra_fields.alloc_size
        if live > peak:
            peak, peak_index = live, i
    blocks = {}
    for node in events[:peak_index + 1]:
        size, ptr = node.extra_fields.alloc_size, node.extra_fields.ptr
        if size > 0:
            blocks[ptr] = (size, node)
        else:
            blocks.pop(ptr, None)
    by_owner = defaultdict(int)
    for size, node in blocks.values():
        op = node.parent
        while op is not None and not str(op.tag).endswith('TorchOp'):
            op = op.parent
        grad_fn = op
        while grad_fn is not None and not grad_fn.name.startswith('autograd::engine'):
            grad_fn = grad_fn.parent
        if grad_fn is not None:
            owner = 'backward: ' + grad_fn.name.split(': ', 1)[-1]
        else:
            owner = (_python_owner(op) if op is not None else None) or '(no Python frame)'
        by_owner[f"{owner} [{op.name if op is not None else '?'}]"] += size
    return peak, sorted(by_owner.items(), key=lambda kv: -kv[1])[:20]


def profile_step(job, opts):
    """One warm-up step, then one step under ``torch.profiler`` (shapes and Python frames).

    Returns operator totals (self CPU time, calls), host syncs, copies, GEMM sizes, and the
    time of top-level operators charged to the Python function that issued them (backward
    operators, issued by the autograd engine, to their ``*Backward`` node).
    """
    device, dtype = torch.device(opts['device']), getattr(torch, opts['dtype'])
    model = build_case(job['case']).to(device)
    model.train(job['mode'] == 'train')
    x = torch.randn(1, 3, *job['shape'], generator=torch.Generator().manual_seed(0)).to(device)
    step = _backbone_step(model, model, x, job['mode'], device, dtype)
    warm = _time_once(step, device)
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    with _quiet(2), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
            with_stack=True, profile_memory=bool(job.get('memory'))) as prof:
        step()
    profiled = time.perf_counter() - t0
    ops = defaultdict(lambda: [0, 0.0])  # name -> [calls, self µs]
    gemm = dict(calls=0, us=0.0, macs=0, call_macs=[])
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CPU:
            continue
        entry = ops[event.name]
        entry[0] += 1
        entry[1] += event.self_cpu_time_total
        if event.name in GEMM_OPERANDS:
            macs = _gemm_macs(event.name, event.input_shapes)
            gemm['calls'] += 1
            gemm['us'] += event.self_cpu_time_total
            if macs:
                gemm['macs'] += macs
                gemm['call_macs'].append(macs)
    owners, backward = Counter(), Counter()
    tree = prof.profiler.kineto_results.experimental_event_tree()
    stack = list(tree)
    while stack:  # top-level operators: the first TorchOp on every path from a root
        node = stack.pop()
        if not str(node.tag).endswith('TorchOp'):
            stack.extend(node.children)
            continue
        us = node.duration_time_ns / 1e3
        if node.name.startswith('autograd::engine::evaluate_function: '):
            backward[node.name.split(': ', 1)[1]] += us
        else:
            owners[_python_owner(node) or '(no Python frame)'] += us
    memory = None
    if job.get('memory'):
        peak, owners_at_peak = _memory_at_peak(tree)
        static = _tensor_bytes(list(model.parameters()) + list(model.buffers()) + [x])
        memory = dict(peak=peak, static=static, owners=owners_at_peak)
    calls = sorted(gemm.pop('call_macs'))
    gemm.update(median_macs=calls[len(calls) // 2] if calls else 0,
                small_calls=sum(m < 2 ** 20 for m in calls))
    return dict(warm_s=warm, profiled_s=profiled,
                total_us=sum(us for _, us in ops.values()),
                calls=sum(c for c, _ in ops.values()),
                ops=sorted(((n, c, us) for n, (c, us) in ops.items()), key=lambda o: -o[2])[:60],
                syncs={n: ops[n][0] for n in SYNC_OPS if n in ops},
                copies={n: ops[n] for n in COPY_OPS if n in ops}, gemm=gemm,
                owners=owners.most_common(25), backward=backward.most_common(15), memory=memory,
                params=sum(p.numel() for p in model.parameters()))


KINDS = dict(backbone=measure_backbone, gemm=measure_gemm, macs=count_macs,
             machine=machine_info, detector=measure_detector, profile=profile_step,
             kernels=profile_kernels)


def run_jobs(conn, jobs, opts):
    """Child entry point: measure ``jobs`` in order and send the list of results on ``conn``."""
    import warnings

    # the toolboxes' deprecation notices would bury the progress lines (one set per child)
    warnings.simplefilter('ignore', UserWarning)
    warnings.simplefilter('ignore', DeprecationWarning)
    _set_threads(opts.get('threads'))
    # what the tools do (mmeffvit.utils.allocator): inference retains freed memory, training
    # only with MMEFFVIT_MALLOC=retain; a child that also trains keeps glibc's defaults
    inference_only = all(job.get('mode') in ('infer', 'test') for job in jobs)
    retain_freed_memory(default=inference_only)
    results = []
    for job in jobs:
        try:
            results.append(KINDS[job['kind']](job, opts))
        except Exception as err:  # noqa: BLE001  reported in the tables, the run goes on
            results.append(dict(error=f'{type(err).__name__}: {err}',
                                traceback=traceback.format_exc(limit=8)))
        conn.send(('result', len(results) - 1, results[-1]))
    conn.send(('done', None, None))
    conn.close()
