"""Attention maps of mmeffvit's backbones, recomputed from their weights and inputs.

The backbones never form their attention matrices (linear attention multiplies ``φ(K)ᵀV``
first; the softmax ones fuse or window them), so the maps are rebuilt here: forward pre-hooks
record what each attention module of the chosen blocks receives (tokens, grid, residual, masks),
then q/k/v are recomputed with the module's own projections and the maps with the code of
:mod:`mmeffvit.analysis.attention_kinds`, in float64. Nothing here depends on how a module
computes its output, only on its class name, its parameter names and its ``forward``
arguments, so the recomputation is checked against the module's output in
``tests/test_vis_attention.py``.

Each block gives a :class:`BlockMaps`: one dense ``(heads, N, n)`` matrix per kind of map (N
the stage's query tokens, n the cells of that kind's key grid, zeros outside a window), and the
geometry of the key grid in stage-token units, so that a row can be drawn over the image.
"""
import inspect

import torch

from .attention_kinds import BlockMaps, MapKind, attention_type, block_maps
from ..utils.suggest import unknown_choice_error

__all__ = ['AttentionRecorder', 'BlockMaps', 'MapKind', 'record_maps', 'stage_blocks']


# -- where the blocks are -------------------------------------------------------------------------
def _pvt_blocks(model, stage):
    return getattr(model, f'block{stage + 1}')


def _pvt_grid_source(model, stage):
    return getattr(model, f'patch_embed{stage + 1}')


#: backbone class -> (blocks of a 0-based stage, module whose output is ``(tokens, (H, W))`` of
#: the stage, needed where blocks only see windows). All are official parameter names.
BACKBONE_LAYOUTS = {
    'FLattenPVT': (_pvt_blocks, None),
    'FLattenPVTv2': (_pvt_blocks, None),
    'LaViT': (_pvt_blocks, _pvt_grid_source),
    'FLattenSwin': (lambda m, s: m.layers[s].blocks, None),
    'FocalTransformer': (lambda m, s: m.layers[s].blocks, None),
    'FLattenCSWin': (lambda m, s: getattr(m, f'stage{s + 1}'), None),
    'L2ViT': (lambda m, s: m.stages[s], None),
}


def backbone_layout(model):
    """The :data:`BACKBONE_LAYOUTS` entry of ``model``'s class (or of a base class)."""
    for cls in type(model).__mro__:
        if cls.__name__ in BACKBONE_LAYOUTS:
            return BACKBONE_LAYOUTS[cls.__name__]
    err = unknown_choice_error('backbone for attention maps', type(model).__name__,
                               BACKBONE_LAYOUTS)
    # FLattenDeiT mixes a class token into its keys, CARE attends on a channel slice
    raise KeyError(err.args[0] + ' (FLattenDeiT and CARE have no attention maps here yet)')


def stage_blocks(model, stage):
    """The blocks of 1-based ``stage`` of ``model``, with a clear error when out of range."""
    num = int(model.num_stages)
    if not 1 <= stage <= num:
        raise ValueError(f'stage {stage} does not exist: {type(model).__name__} has stages '
                         f'1..{num}')
    return backbone_layout(model)[0](model, stage - 1)


# -- capture --------------------------------------------------------------------------------------
def _detached(value):
    """A CPU copy: the maps are computed on the CPU, in float64, whatever the model's device."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, tuple) and hasattr(value, '_fields'):  # a named tuple
        return type(value)(*(_detached(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    return value


def _bound_arguments(module, args, kwargs):
    """``forward``'s arguments by name (positional or keyword), tensors detached."""
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    return {name: _detached(value) for name, value in bound.arguments.items()}


class AttentionRecorder:
    """Records the inputs of the attention modules of chosen blocks during one forward.

    Args:
        model: An mmeffvit backbone listed in :data:`BACKBONE_LAYOUTS`.
        targets (Iterable[tuple[int, int]]): 1-based ``(stage, block)`` pairs.

    Use as a context manager around ``model(images)`` (batch of one), then :meth:`maps`.
    :attr:`inputs` holds ``{(stage, block): {module name: (module, forward arguments)}}`` and
    :attr:`outputs` ``{((stage, block), module name): output}`` (CPU copies), e.g. to check a
    map against what the module computed.
    """

    def __init__(self, model, targets):
        self.model = model
        self.targets = []
        self._handles = []
        self._grids = {}
        self._block_inputs = {}
        self.inputs = {}
        self.outputs = {}
        grid_source = backbone_layout(model)[1]
        for stage, block in targets:
            blocks = stage_blocks(model, stage)
            if not 1 <= block <= len(blocks):
                raise ValueError(f'block {block} does not exist: stage {stage} of '
                                 f'{type(model).__name__} has blocks 1..{len(blocks)}')
            module = blocks[block - 1]
            found = [(name, sub) for name, sub in module.named_modules()
                     if attention_type(sub) is not None]
            # an attention module can hold another (the CSWin core in its LePE wrapper): keep
            # the outermost ones
            found = [(n, s) for n, s in found
                     if not any(n != o and n.startswith(o + '.') for o, _ in found)]
            if not found:
                raise ValueError(f'stage {stage} block {block} ({type(module).__name__}) has no '
                                 'attention module whose maps can be recomputed')
            key = (stage, block)
            self.targets.append((key, module, found))
            self.inputs[key] = {}
            self._handles.append(module.register_forward_pre_hook(
                self._keep_block_input(key), with_kwargs=True))
            for name, sub in found:
                self._handles.append(sub.register_forward_pre_hook(
                    self._keep_input(key, name), with_kwargs=True))
                self._handles.append(sub.register_forward_hook(self._keep_output(key, name)))
            if grid_source is not None and stage not in self._grids:
                self._grids[stage] = None
                self._handles.append(grid_source(model, stage - 1).register_forward_hook(
                    self._keep_grid(stage)))

    def _keep_block_input(self, key):
        def hook(module, args, kwargs):
            self._block_inputs[key] = _bound_arguments(module, args, kwargs)
        return hook

    def _keep_input(self, key, name):
        def hook(module, args, kwargs):
            self.inputs[key][name] = (module, _bound_arguments(module, args, kwargs))
        return hook

    def _keep_output(self, key, name):
        def hook(module, args, output):
            self.outputs[(key, name)] = _detached(output)
        return hook

    def _keep_grid(self, stage):
        def hook(module, args, output):
            self._grids[stage] = tuple(int(s) for s in output[1])
        return hook

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @torch.no_grad()
    def maps(self):
        """One :class:`BlockMaps` per target, in the order given."""
        results = []
        for (stage, block), module, found in self.targets:
            records = self.inputs[(stage, block)]
            if len(records) != len(found) or (stage, block) not in self._block_inputs:
                raise RuntimeError(f'stage {stage} block {block} did not run in the forward '
                                   '(out_indices may stop the backbone before it)')
            block_args = self._block_inputs[(stage, block)]
            grid = self._grids.get(stage)
            if grid is None:
                grid = tuple(int(s) for s in _grid_argument(block_args))
            results.append(block_maps(stage, block, [records[n] for n, _ in found], grid,
                                      module))
        return results


def _grid_argument(arguments):
    """The ``(H, W)`` argument of a block's ``forward`` (its second argument in every family)."""
    values = list(arguments.values())
    if len(values) < 2 or not isinstance(values[1], (tuple, list)) or len(values[1]) != 2:
        raise RuntimeError(f'cannot read the token grid from the block arguments '
                           f'{list(arguments)}')
    return values[1]


def record_maps(model, images, targets):
    """Run ``model`` on ``images`` ``(1, 3, H, W)`` and return the :class:`BlockMaps` of
    ``targets`` (1-based ``(stage, block)`` pairs), plus the backbone's outputs."""
    if images.dim() != 4 or images.shape[0] != 1:
        raise ValueError(f'expected one image (1, C, H, W), got {tuple(images.shape)}')
    with AttentionRecorder(model, targets) as recorder, torch.no_grad():
        outputs = model(images)
    return recorder.maps(), outputs
