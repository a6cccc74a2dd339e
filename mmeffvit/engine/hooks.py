"""Hooks that ``tools/train.py`` adds to every config (see :func:`add_default_hooks`).

* :class:`ResumeStateHook` makes ``--resume`` exact: checkpoints carry every rank's random number
  generator states and the data sampler's seed, restored at the point where the uninterrupted run
  would have drawn its next batch.
* :class:`NonFiniteLossHook` stops training at the first NaN/inf loss, naming the iteration and
  the loss terms.

mmdet's ``CheckInvalidLossHook`` is not reused for the second: it checks only the total loss,
every 50 iterations by default, through an ``assert`` whose message is ``None`` (it logs and
returns nothing), and mmseg/mmpretrain have no such hook.
"""
import math
import random
from typing import List, Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from .errors import NonFiniteLossError

#: Top-level key of the extra state in a checkpoint.
RESUME_STATE_KEY = 'resume_state'


def capture_rng_state() -> dict:
    """The states of python's, numpy's and torch's (CPU and CUDA) global generators.

    Stored as tensors and plain numbers, which ``torch.load(weights_only=True)`` accepts.
    """
    version, internal, gauss_next = random.getstate()
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = dict(
        python=dict(version=version, internal=torch.tensor(internal, dtype=torch.int64),
                    gauss_next=gauss_next),
        numpy=dict(keys=torch.from_numpy(keys.astype(np.int64)), pos=int(pos),
                   has_gauss=int(has_gauss), cached_gaussian=float(cached_gaussian)),
        torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Inverse of :func:`capture_rng_state` (tensors may come back on any device)."""
    py = state['python']
    random.setstate((py['version'], tuple(py['internal'].tolist()), py['gauss_next']))
    npy = state['numpy']
    np.random.set_state(('MT19937', npy['keys'].cpu().numpy().astype(np.uint32), npy['pos'],
                         npy['has_gauss'], npy['cached_gaussian']))
    torch.set_rng_state(state['torch'].cpu())
    if 'cuda' in state and torch.cuda.is_available():
        cuda_states = [s.cpu() for s in state['cuda']]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            print_log(f'the checkpoint holds CUDA generator states of {len(cuda_states)} '
                      f'devices, this process sees {torch.cuda.device_count()}: CUDA random '
                      'numbers are not restored', logger='current', level='WARNING')


def _train_sampler(dataloader):
    """The sampler that carries the shuffling seed (behind a batch sampler in mmdet)."""
    for sampler in (getattr(dataloader, 'sampler', None),
                    getattr(getattr(dataloader, 'batch_sampler', None), 'sampler', None)):
        if sampler is not None and hasattr(sampler, 'seed'):
            return sampler
    return None


class _RestoreAfterSkip:
    """Stands in for IterBasedTrainLoop's data iterator while the loop skips trained batches.

    On resume the loop draws ``skip`` batches to move the sampler (and dataloader workers) to
    where the checkpoint was written; with ``num_workers=0`` that runs the augmentation pipeline
    and consumes the global generators. The checkpoint's states are therefore restored just
    before the first batch that is trained on, after which the real iterator is put back.
    """

    def __init__(self, loop, skip: int, restore) -> None:
        self._loop, self._iterator = loop, loop.dataloader_iterator
        self._skip, self._restore = skip, restore

    def __iter__(self):
        return self

    def __next__(self):
        if self._skip > 0:
            self._skip -= 1
            return next(self._iterator)
        self._restore()
        self._loop.dataloader_iterator = self._iterator
        return next(self._iterator)

    def __getattr__(self, name):
        return getattr(self._iterator, name)


@HOOKS.register_module()
class ResumeStateHook(Hook):
    """Save the random generators and the sampler seed with each checkpoint; restore on resume.

    With ``randomness=dict(seed=..., deterministic=True)`` a run killed after a checkpoint and
    resumed from it logs the same losses as the uninterrupted run, with stochastic depth, dropout
    and random augmentation on (bitwise on CPU). What it saves, per rank: python ``random``,
    numpy's and torch's CPU/CUDA global generators. Where it restores them:

    * IterBasedTrainLoop: after the loop has skipped the already trained batches, right before
      the first new batch is drawn (the skip itself runs the pipeline, see ``_RestoreAfterSkip``);
    * EpochBasedTrainLoop: in ``before_train``, before the next epoch's data iterator is made.

    Validation during training runs between saved generator states and restores them afterwards,
    so it neither shifts the training's random stream nor makes resumed runs differ.

    Not covered: dataloader workers that persist across epochs (``persistent_workers=True`` with
    an epoch-based loop) keep generator states that only live in the worker processes.
    """

    priority = 'LOW'  # after the optimizer step and the logger, before CheckpointHook saves

    def __init__(self) -> None:
        self._saved: Optional[dict] = None  # states captured for the checkpoint being written
        self._loaded: Optional[dict] = None  # state read from the checkpoint being resumed
        self._loaded_meta: Optional[dict] = None
        self._val_state: Optional[dict] = None

    # -- saving -----------------------------------------------------------------------------
    @staticmethod
    def _save_due(runner, by_epoch: bool) -> bool:
        """Whether a CheckpointHook saves right after this hook (same test as that hook)."""
        for hook in runner.hooks:
            if not isinstance(hook, CheckpointHook) or hook.by_epoch != by_epoch:
                continue
            if by_epoch:
                due = hook.every_n_epochs(runner, hook.interval, hook.save_begin) or (
                    hook.save_last and hook.is_last_train_epoch(runner))
            else:
                due = hook.every_n_train_iters(runner, hook.interval, hook.save_begin) or (
                    hook.save_last and hook.is_last_train_iter(runner))
            if due:
                return True
        return False

    def _capture(self, runner, by_epoch: bool) -> None:
        if not self._save_due(runner, by_epoch):
            self._saved = None
            return
        local = capture_rng_state()
        # every rank takes part in the gather; only rank 0 writes the checkpoint
        ranks = all_gather_object(local) if get_world_size() > 1 else [local]
        self._saved = dict(step=(runner.epoch, runner.iter), ranks=ranks)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self._capture(runner, by_epoch=False)

    def after_train_epoch(self, runner) -> None:
        self._capture(runner, by_epoch=True)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        saved = self._saved
        if saved is None or saved['step'] != (runner.epoch, runner.iter):
            # a save this hook did not foresee (e.g. a best checkpoint): rank 0 is all it has
            saved = dict(ranks=[capture_rng_state()])
        state = dict(rng=saved['ranks'], world_size=get_world_size())
        loop = getattr(runner, '_train_loop', None)
        sampler = _train_sampler(getattr(loop, 'dataloader', None))
        if sampler is not None:
            state['sampler'] = dict(type=type(sampler).__name__, seed=int(sampler.seed),
                                    epoch=int(getattr(sampler, 'epoch', 0)))
        checkpoint[RESUME_STATE_KEY] = state

    # -- validation in between ----------------------------------------------------------------
    def before_val(self, runner) -> None:
        self._val_state = capture_rng_state()

    def after_val(self, runner) -> None:
        if self._val_state is not None:
            restore_rng_state(self._val_state)
            self._val_state = None

    # -- resuming -----------------------------------------------------------------------------
    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        # called for load_from as well; before_train tells a resume from a weight load
        self._loaded = checkpoint.get(RESUME_STATE_KEY, None)
        self._loaded_meta = dict(checkpoint.get('meta', {}))

    def before_train(self, runner) -> None:
        meta, state = self._loaded_meta, self._loaded
        self._loaded = self._loaded_meta = None
        if meta is None or (runner.iter, runner.epoch) == (0, 0):
            return  # a fresh run, possibly from load_from weights
        if (meta.get('iter'), meta.get('epoch')) != (runner.iter, runner.epoch):
            return
        if state is None:
            runner.logger.warning(
                'the resumed checkpoint holds no random generator states (it was not written '
                'with ResumeStateHook): training goes on, but its random draws (data '
                'augmentation, drop path, dropout) differ from those of an uninterrupted run')
            return
        rank_state = self._state_of_this_rank(runner, state)
        self._restore_sampler_seed(runner, state.get('sampler'))
        loop = runner.train_loop
        if rank_state is None:
            return
        if hasattr(loop, 'dataloader_iterator') and runner.iter > 0:
            loop.dataloader_iterator = _RestoreAfterSkip(
                loop, runner.iter, lambda: restore_rng_state(rank_state))
        else:
            restore_rng_state(rank_state)
        runner.logger.info('random generator states restored from the checkpoint')

    @staticmethod
    def _state_of_this_rank(runner, state: dict) -> Optional[dict]:
        ranks: List[dict] = state['rng']
        rank, world_size = get_rank(), get_world_size()
        if state.get('world_size') != world_size:
            runner.logger.warning(
                f"the checkpoint was written by {state.get('world_size')} processes, this run "
                f'has {world_size}: random draws differ from the uninterrupted run')
        if rank >= len(ranks):
            runner.logger.warning(f'the checkpoint has no random generator state for rank '
                                  f'{rank}; this rank keeps its freshly seeded generators')
            return None
        return ranks[rank]

    @staticmethod
    def _restore_sampler_seed(runner, saved: Optional[dict]) -> None:
        """Give the sampler the checkpoint's seed (an unseeded run draws a new one)."""
        loop = runner.train_loop
        sampler = _train_sampler(loop.dataloader)
        if saved is None or sampler is None or sampler.seed == saved['seed']:
            return
        runner.logger.warning(f"the data sampler's seed ({sampler.seed}) differs from the "
                              f"checkpoint's ({saved['seed']}); using the checkpoint's, so the "
                              'data order continues as before the interruption')
        sampler.seed = saved['seed']
        if hasattr(sampler, '_indices_of_rank'):  # InfiniteSampler made its generator already
            sampler.indices = sampler._indices_of_rank()
        if hasattr(loop, 'dataloader_iterator'):  # workers may have prefetched with the old seed
            loop.dataloader_iterator = type(loop.dataloader_iterator)(loop.dataloader)


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Stop training at the first iteration whose loss terms are not all finite.

    Runs before the logger and the checkpoint hook, so no NaN checkpoint is written. The error
    names the iteration and every non-finite term (e.g. ``loss_mask``).

    Args:
        interval (int): check every ``interval`` iterations (1: every iteration; the check is a
            few scalar comparisons).
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self, interval: int = 1) -> None:
        if interval < 1:
            raise ValueError(f'NonFiniteLossHook: interval must be >= 1, got {interval}')
        self.interval = interval

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if not outputs or not self.every_n_train_iters(runner, self.interval):
            return
        bad = {}
        for name, value in outputs.items():
            if 'loss' not in name:
                continue
            number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 \
                else value
            if isinstance(number, (int, float)) and not math.isfinite(number):
                bad[name] = number
        if bad:
            terms = ', '.join(f'{name}={value}' for name, value in bad.items())
            raise NonFiniteLossError(
                f'non-finite loss at iteration {runner.iter + 1} (epoch {runner.epoch + 1}): '
                f'{terms}. Training stopped before saving it. Lower the learning rate, enable '
                'gradient clipping (optim_wrapper.clip_grad=dict(max_norm=...)) or check the '
                'annotations of this batch.')


def add_default_hooks(cfg) -> None:
    """Append ResumeStateHook and NonFiniteLossHook to ``cfg.custom_hooks`` unless present."""
    hooks = list(cfg.get('custom_hooks', None) or [])
    present = {h.get('type') for h in hooks if isinstance(h, dict)}
    for name in ('ResumeStateHook', 'NonFiniteLossHook'):
        if name not in present:
            hooks.append(dict(type=name))
    cfg.custom_hooks = hooks
