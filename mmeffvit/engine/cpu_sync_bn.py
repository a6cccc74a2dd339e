"""Synchronized batch norm for CPU (gloo) process groups.

``torch.nn.SyncBatchNorm`` runs only on CUDA (DDP refuses a CPU module holding one: "SyncBatchNorm
layers only work with GPU modules"), and mmseg's and the Swin/Focal cascade configs use it. On a
CPU process group :func:`convert_sync_batchnorm_for_cpu` swaps every SyncBN for
:class:`CPUSyncBatchNorm`, which takes its training statistics over the whole global batch, as
SyncBN does, through differentiable all-reduces, so forward and gradients match batch norm on the
concatenated batch. Parameter and buffer names are those of batch norm, so checkpoints move freely
between CPU and GPU runs.
"""
import itertools

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from mmengine.registry import MODEL_WRAPPERS
from torch.nn.modules.batchnorm import _BatchNorm


class CPUSyncBatchNorm(_BatchNorm):
    """Batch norm over the batches of all ranks of ``process_group``, for CPU tensors.

    In training the mean and the (biased) variance of each channel are reduced over every rank's
    batch and spatial positions in two passes (sum and count, then squared deviations from the
    global mean), which keeps the precision of single-process batch norm. The all-reduces are
    those of ``torch.distributed.nn``, whose backward all-reduces the gradients, so each rank
    receives the gradient of the sum of all ranks' losses, as with CUDA SyncBN. Outside a process
    group, or in eval mode with running statistics, it is plain batch norm.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device,
                         dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f'expected at least a 2D input (got {input.dim()}D input)')

    def _synchronized(self) -> bool:
        return (dist.is_available() and dist.is_initialized()
                and dist.get_world_size(self.process_group) > 1)

    def forward(self, input):
        self._check_input_dim(input)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or not self._synchronized():
            return super().forward(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average, as in _BatchNorm
                momentum = 1.0 / float(self.num_batches_tracked)
        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        count = x.new_full((1, ), x.numel() // x.size(1))
        sum_and_count = dist_fn.all_reduce(torch.cat([x.sum(dims), count]),
                                           group=self.process_group)
        total = sum_and_count[-1]
        if total.item() == 0:  # no element on any rank: nothing to normalise
            return input
        mean = sum_and_count[:-1] / total
        centred = x - mean.view(shape)
        var = dist_fn.all_reduce((centred * centred).sum(dims), group=self.process_group) / total
        out = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                unbiased = var * (total / (total - 1)) if total.item() > 1 else var
                self.running_mean.mul_(1 - momentum).add_(momentum * mean.to(self.running_mean))
                self.running_var.mul_(1 - momentum).add_(momentum * unbiased.to(self.running_var))
        return out.to(input.dtype)


def _is_gpu_only_sync_bn(module) -> bool:
    if isinstance(module, torch.nn.SyncBatchNorm):
        return True
    try:  # mmcv's own CUDA SyncBN ('MMSyncBN')
        from mmcv.ops import SyncBatchNorm as MMCVSyncBatchNorm
    except ImportError:
        return False
    return isinstance(module, MMCVSyncBatchNorm)


def convert_sync_batchnorm_for_cpu(module: torch.nn.Module, process_group=None):
    """Return ``module`` with every CUDA-only SyncBN replaced by :class:`CPUSyncBatchNorm`.

    Weights, running statistics, ``requires_grad`` and train/eval mode carry over; the names of
    parameters and buffers stay the same.
    """
    converted = module
    if _is_gpu_only_sync_bn(module):
        floats = [t for t in itertools.chain(module.parameters(), module.buffers())
                  if t.is_floating_point()]
        keep = dict(device=floats[0].device, dtype=floats[0].dtype) if floats else {}
        converted = CPUSyncBatchNorm(module.num_features, module.eps, module.momentum,
                                     module.affine, module.track_running_stats,
                                     process_group=process_group, **keep)
        # load_state_dict copies weights and buffers; the parameter objects' flags follow
        converted.load_state_dict(module.state_dict())
        if module.affine:
            converted.weight.requires_grad_(module.weight.requires_grad)
            converted.bias.requires_grad_(module.bias.requires_grad)
        converted.train(module.training)
    for name, child in module.named_children():
        new_child = convert_sync_batchnorm_for_cpu(child, process_group)
        if new_child is not child:
            converted.add_module(name, new_child)
    return converted


def cpu_wrapper_type(wrapper_cls: type) -> str:
    """Register (once) and name a subclass of DDP wrapper ``wrapper_cls`` for CPU process groups.

    The subclass converts the module with :func:`convert_sync_batchnorm_for_cpu` before wrapping
    it: the runner builds the model (``cfg.sync_bn`` conversions included) before the wrapper, and
    DDP refuses CUDA SyncBN in a CPU module at construction.
    """
    name = f'CPUSyncBN{wrapper_cls.__name__}'
    if MODEL_WRAPPERS.get(name) is None:

        def __init__(self, module, **kwargs):
            wrapper_cls.__init__(self, module=convert_sync_batchnorm_for_cpu(module), **kwargs)

        MODEL_WRAPPERS.register_module(
            name=name, module=type(name, (wrapper_cls, ), {'__init__': __init__}))
    return name
