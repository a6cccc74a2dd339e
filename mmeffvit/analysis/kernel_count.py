"""What a backbone's forward would launch on a GPU, counted on a CPU with fake CUDA tensors.

A :class:`~torch._subclasses.fake_tensor.FakeTensorMode` holds the model's parameters and the
input as CUDA tensors that have shapes, dtypes and strides but no memory and never compute, so
every path the model takes for a CUDA tensor runs (the entry points of :mod:`mmeffvit.ops`
choose their CUDA branches) on a machine without a GPU. A
:class:`~torch.utils._python_dispatch.TorchDispatchMode` inside it sees every ATen operator:

* *kernels*: operators that launch work, i.e. not views, not metadata queries and not bare
  allocations (one ATen operator is one kernel in eager CUDA, give or take a fused epilogue;
  an mmeffvit Triton op counts its launches, :func:`mmeffvit.ops.triton_kernels.cost`);
* *bytes*: the bytes of the tensor arguments read plus the outputs written by those operators
  (an upper bound on the traffic of each kernel: it ignores caching between them);
* *FLOPs*: of the matrix products, convolutions and attention kernels (the formulas of
  ``torch.utils.flop_counter``; not its ``FlopCounterMode``, whose global module hooks would
  send the models down their hooked paths);
* *data-dependent operators*: those whose output shape or a Python value depends on tensor
  data (``nonzero``, ``item`` / ``bool(tensor)`` / ``tolist``'s ``_local_scalar_dense``,
  ``masked_select``, ``unique``, ``repeat_interleave`` without a size). On a real GPU each is a
  device-to-host sync; fake tensors, ``torch.compile(fullgraph=True)``, CUDA graphs and export
  stop at the first one, and so does the count (the operator and its caller are reported).

bf16 is counted by casting the model and the input (CUDA autocast switches itself off where
no GPU is present). Where no GPU is present ``F.scaled_dot_product_attention`` on fake CUDA
tensors would take its math path (its backend choice asks the device); :class:`FusedSDPAChoice`
makes the choice an sm80+ GPU makes instead (flash, then memory-efficient, then math).
"""
import collections
import dataclasses
import traceback

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                           DynamicOutputShapeException, FakeTensor,
                                           FakeTensorMode)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from mmeffvit.ops.triton_kernels import cost as triton_cost

#: operators whose output shape or returned value depends on tensor data
DATA_DEPENDENT = frozenset({
    'aten.nonzero', 'aten._local_scalar_dense', 'aten.masked_select', 'aten.unique',
    'aten._unique', 'aten._unique2', 'aten.unique_dim', 'aten.unique_consecutive',
    'aten.argwhere', 'aten.equal', 'aten.is_nonzero'})
#: operators that launch no kernel: allocations, metadata, aliasing
NO_KERNEL = frozenset({
    'aten.empty', 'aten.empty_strided', 'aten.empty_like', 'aten.new_empty',
    'aten.new_empty_strided', 'aten.detach', 'aten.alias', 'aten.lift_fresh', 'aten.sym_size',
    'aten.sym_stride', 'aten.sym_numel', 'aten.sym_storage_offset', 'aten.is_contiguous',
    'aten.is_same_size', 'aten._has_compatible_shallow_copy_type', 'aten.set_', 'aten.resize_',
    'aten.is_coalesced', 'aten.dim', 'aten.size', 'aten.stride', 'aten.numel',
    'aten._unsafe_view', 'aten._reshape_alias',
    # dtype arithmetic on the host, dispatched as operators
    'aten.promote_types', 'aten.result_type', 'aten.can_cast'})


@dataclasses.dataclass
class Count:
    """What one forward launched."""
    kernels: int = 0
    bytes: int = 0
    flops: int = 0
    data_dependent: list = dataclasses.field(default_factory=list)  # 'op at file:line'
    by_op: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def _tensor_bytes(values):
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, (list, tuple)):
            total += _tensor_bytes(value)
    return total


def _caller():
    """``file:line`` of the innermost frame of mmeffvit (or, failing that, outside torch)."""
    frames = traceback.extract_stack()[:-3]
    for frame in reversed(frames):
        if '/mmeffvit/' in frame.filename and '/analysis/' not in frame.filename:
            return f'{frame.filename.split("/mmeffvit/", 1)[1]}:{frame.lineno}'
    for frame in reversed(frames):
        if '/torch/' not in frame.filename and frame.filename != __file__:
            return f'{frame.filename}:{frame.lineno}'
    return '?'


class KernelCounter(TorchDispatchMode):
    """Counts the kernels, bytes and data-dependent operators of what runs inside it."""

    def __init__(self):
        super().__init__()
        self.count = Count()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        flagged = name in DATA_DEPENDENT or (name == 'aten.repeat_interleave'
                                             and kwargs.get('output_size') is None
                                             and isinstance(args[0], torch.Tensor)
                                             and len(args) < 2)
        if flagged:
            self.count.data_dependent.append(f'{name} at {_caller()}')
        try:
            out = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            if not flagged:  # e.g. indexing by a boolean mask (a nonzero inside)
                self.count.data_dependent.append(f'{name} at {_caller()}')
            raise
        if not (func.is_view or name in NO_KERNEL or name.startswith('prim.')):
            launches, flops = triton_cost(name, args) or (1, 0)  # a Triton op: its launches
            self.count.kernels += launches
            self.count.flops += flops
            self.count.by_op[name] += launches
            self.count.bytes += _tensor_bytes(args) + _tensor_bytes(kwargs.values())
            self.count.bytes += _tensor_bytes(out if isinstance(out, (list, tuple)) else [out])
            if func.overloadpacket in flop_registry:
                self.count.flops += flop_registry[func.overloadpacket](*args, **kwargs,
                                                                       out_val=out)
        return out


_HALF = (torch.float16, torch.bfloat16)


def fused_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    """``F.scaled_dot_product_attention`` on fake CUDA tensors through the fused kernel an sm80+
    GPU would choose (PyTorch's ``sdp_utils`` rules, the main ones): flash for 16-bit inputs
    without a mask and one head size ≤ 256; memory-efficient for fp32 / 16-bit inputs whose
    head sizes are multiples of 8 (16-bit) or 4 (fp32), a mask allowed (a boolean one is first
    turned into an additive one, as SDPA does); None where neither applies (math path)."""
    tensors = (query, key, value)
    if (enable_gqa or not all(isinstance(t, FakeTensor) and t.device.type == 'cuda'
                              and t.dim() == 4 and t.stride(-1) == 1 for t in tensors)
            or query.shape[-1] != key.shape[-1]):
        return None
    d, e = query.shape[-1], value.shape[-1]
    if attn_mask is None and query.dtype in _HALF and d == e <= 256:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    align = 8 if query.dtype in _HALF else 4
    if query.dtype not in _HALF + (torch.float32, ) or d % align or e % align:
        return None
    bias = attn_mask
    if bias is not None:
        if bias.dtype == torch.bool:  # two kernels, as SDPA's own conversion
            bias = torch.full_like(bias, float('-inf'), dtype=query.dtype).masked_fill_(bias, 0.)
        bias = bias.expand(*query.shape[:-1], key.shape[-2])
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, torch.is_grad_enabled(), dropout_p, is_causal, scale=scale)[0]


class FusedSDPAChoice(TorchFunctionMode):
    """Inside it, ``F.scaled_dot_product_attention`` on fake CUDA tensors runs the fused kernel
    a GPU would choose (:func:`fused_sdpa`); a no-op where a GPU is present (its own choice
    applies)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and not torch.cuda.is_available():
            out = fused_sdpa(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _run_counted(fn):
    """The count of ``fn()``, stopped at the first data-dependent operator where the fake
    tensors cannot go on."""
    counter = KernelCounter()
    try:
        with FusedSDPAChoice(), counter:
            fn()
    except Exception as err:  # noqa: BLE001 (data-dependent shapes end a fake run)
        if not counter.count.data_dependent:
            raise
        counter.count.data_dependent.append(f'stopped: {type(err).__name__}')
    return counter.count


def count_backbone(model, shape=(800, 1333), batch=2, dtype=torch.float32, train=False):
    """Counts of a forward of ``model`` on fake CUDA tensors (the second of two of that size,
    its per-shape caches filled; the first where that one stops), in eval or ``train`` mode
    (autograd recording; its backward cannot run here: the autograd engine asks the CUDA
    driver for a device context, which a machine without a GPU does not have).

    Returns:
        Count: the model is left on fake tensors (build a fresh one to run it for real).
    """
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to(device='cuda', dtype=dtype)
        model.train(train)
        x = torch.randn(batch, 3, *shape, device='cuda', dtype=dtype)
        with torch.set_grad_enabled(train):
            # the first call fills the per-shape caches (index tables, masks): its syncs count,
            # its kernels not; the second is what every later step of that size launches
            first = _run_counted(lambda: model(x))
            if first.data_dependent:
                return first
            forward = _run_counted(lambda: model(x))
    return forward
