"""A backbone's step as the benchmark tools run it: built from a case dict, one inference or
one training step (optionally with the configs' AdamW step), timed by CUDA events or the wall
clock. Shared by :mod:`.benchmark_worker` and :mod:`.kernel_profile`."""
import contextlib
import os
import sys
import time

import torch


def sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_once(fn, device):
    """Seconds of one call: CUDA events on a GPU, the wall clock on a CPU."""
    if device.type == 'cuda':
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@contextlib.contextmanager
def quiet(fd):
    """Silence a file descriptor (2: kineto's start/stop lines, printed from C++ on every
    profiled run; 1: the weight-initialisation log of the toolboxes)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, 'w') as null:
            os.dup2(null.fileno(), fd)
            yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(saved, fd)
        os.close(saved)


def build_case(case):
    """The backbone of a case dict (``scope``: 'mmeffvit' or 'mmdet'; ``cfg``: its config)."""
    import copy
    if case['scope'] == 'mmdet':
        import mmdet.models  # noqa: F401  registers mmdet's backbones
        from mmdet.registry import MODELS
    else:
        import mmeffvit  # noqa: F401
        from mmeffvit.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(case['cfg']))
    if hasattr(model, 'init_weights'):
        with quiet(1):
            model.init_weights()
    return model


def autocast(device, dtype):
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


def backbone_step(model, run, x, mode, device, dtype, optimizer=None):
    """A closure that runs one inference (``infer``) or one training step (``train``; with
    ``optimizer='adamw'`` also the detection configs' AdamW step)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optim = None
    if optimizer == 'adamw' and mode == 'train':
        optim = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05)

    def infer():
        with torch.no_grad(), autocast(device, dtype):
            run(x)

    def train():
        for p in params:
            p.grad = None
        with autocast(device, dtype):
            outs = run(x)
            loss = sum(o.float().sum() for o in outs)
            # backbones that compute auxiliary losses in training (LaViT's L_DP) pay for them
            aux = model.aux_losses() if hasattr(model, 'aux_losses') else {}
            loss = loss + sum(v for v in aux.values())
        loss.backward()
        if optim is not None:
            optim.step()
    return infer if mode == 'infer' else train
