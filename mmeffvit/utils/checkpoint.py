"""Reading checkpoints without running code from them, for every path into mmeffvit and mmengine.

:func:`load_checkpoint_file` reads a local file with the readers of
:mod:`mmeffvit.utils.checkpoint_readers`:

* the **runner reader** by default (``--resume``, ``load_from``, ``tools/test.py``, the
  toolboxes' own scripts and Inferencers, through mmengine's ``CheckpointLoader``): tensors,
  plain containers and what mmengine's runner writes;
* the **tensors-only reader** with ``tensors_only=True`` (``init_cfg=Pretrained``, the
  converters), for files the runner reader refuses: unknown classes (argparse / yacs objects of
  official training files) become inert, only dicts of tensors are kept;
* a **full unpickle** only for files the user trusts (``--trust-checkpoint`` or
  ``MMEFFVIT_TRUST_CHECKPOINTS=1``), with a warning naming what the safe readers refused.

:func:`allow_mmengine_checkpoints` (run when mmeffvit is imported; configs import it through
``custom_imports`` before any checkpoint is read) routes mmengine's local and URL loaders through
the runner reader and installs the fit check of :mod:`mmeffvit.utils.checkpoint_fit`.
"""
import logging
import os
import os.path as osp
import pickle
import zipfile
from urllib.parse import urlparse

import torch
from mmengine.logging import print_log

from .checkpoint_readers import (TRUST_ENV, CorruptCheckpointError,  # noqa: F401
                                 UnsafeCheckpointError, corrupt_error, read_runner_file,
                                 read_tensors_only)

_TRUE = ('1', 'true', 'yes', 'on')


# -- trust opt-in -------------------------------------------------------------------------------
def trust_requested():
    """Whether ``MMEFFVIT_TRUST_CHECKPOINTS`` asks for full unpickling of refused files."""
    return os.environ.get(TRUST_ENV, '').strip().lower() in _TRUE


def add_trust_argument(parser):
    """Add ``--trust-checkpoint`` to a command-line parser."""
    parser.add_argument(
        '--trust-checkpoint', action='store_true',
        help='unpickle checkpoints in full when the safe reader refuses them (this runs any code '
        f'the file holds: only for files from a source you trust; same as {TRUST_ENV}=1)')


def apply_trust_argument(args):
    """Export ``--trust-checkpoint`` to the environment (seen by every loader), with a warning."""
    if getattr(args, 'trust_checkpoint', False):
        os.environ[TRUST_ENV] = '1'
    if trust_requested():
        print_log(f'{TRUST_ENV} is set: checkpoints that the safe reader refuses will be '
                  'unpickled in full, which runs any code they contain', logger='current',
                  level=logging.WARNING)


# -- entry point ----------------------------------------------------------------------------------
def load_checkpoint_file(path, map_location='cpu', tensors_only=False, trust=None):
    """Read a local checkpoint without running code from it; clear errors for bad files.

    Args:
        path (str): Local file path.
        map_location: Passed to :func:`torch.load`.
        tensors_only (bool): Read files the runner reader refuses (official training files with
            argparse / yacs objects) with the tensors-only reader: only (nested) dicts of tensors
            are returned. Files the runner reader accepts are returned whole either way.
        trust (bool, optional): Unpickle refused files in full (with a warning). Default: the
            ``MMEFFVIT_TRUST_CHECKPOINTS`` environment variable (set by ``--trust-checkpoint``).

    Returns:
        The checkpoint object.

    Raises:
        UnsafeCheckpointError: the file holds objects the safe readers refuse.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path}')
    if osp.getsize(path) == 0:
        raise CorruptCheckpointError(
            f'checkpoint {path} is empty (0 bytes): the download or save was cut')
    trust = trust_requested() if trust is None else trust
    corrupt = (RuntimeError, zipfile.BadZipFile, EOFError, ValueError, KeyError, TypeError,
               AttributeError, IndexError, pickle.UnpicklingError)
    try:
        return read_runner_file(path, map_location)
    except CorruptCheckpointError:
        raise
    except UnsafeCheckpointError as refusal:
        if tensors_only and not trust:
            try:
                ckpt, ignored = read_tensors_only(path, map_location)
            except UnsafeCheckpointError:
                raise
            except corrupt as err:
                raise corrupt_error(path, err) from err
            print_log(f'{path}: read its tensors only; ignored {ignored}', logger='current')
            return ckpt
        if not trust:
            raise
        print_log(f'{path}: unpickled in full because it is trusted ({TRUST_ENV} / '
                  f'--trust-checkpoint), although {str(refusal).split(": it holds ")[-1]}',
                  logger='current', level=logging.WARNING)
        try:
            return torch.load(path, map_location=map_location, weights_only=False)
        except corrupt as err:
            raise corrupt_error(path, err) from err
    except (RuntimeError, zipfile.BadZipFile, EOFError, ValueError, KeyError) as err:
        raise corrupt_error(path, err) from err


# -- mmengine integration ---------------------------------------------------------------------
def _mmengine_local_loader(filename, map_location=None):
    """Replacement of mmengine's loader for local paths (same contract: path, map_location)."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    from .checkpoint_fit import remember_source
    return remember_source(load_checkpoint_file(filename, map_location=map_location), filename)


def download_checkpoint(url, model_dir=None, progress=True):
    """Download ``url`` into torch's hub cache (once) and return the local path."""
    model_dir = model_dir or osp.join(torch.hub.get_dir(), 'checkpoints')
    os.makedirs(model_dir, exist_ok=True)
    cached = osp.join(model_dir, osp.basename(urlparse(url).path) or 'checkpoint.pth')
    if not osp.isfile(cached):
        match = torch.hub.HASH_REGEX.search(osp.basename(cached))
        torch.hub.download_url_to_file(url, cached, match.group(1) if match else None,
                                       progress=progress)
    return cached


def _safe_load_url(url, model_dir=None, map_location=None, progress=True, **kwargs):
    """Stand-in for mmengine's ``load_url`` (torch.hub's, which unpickles with weights_only=False).

    Used by mmengine's http(s), torchvision://, open-mmlab:// and mmcls:// loaders.
    """
    from .checkpoint_fit import remember_source
    path = download_checkpoint(url, model_dir=model_dir, progress=progress)
    return remember_source(load_checkpoint_file(path, map_location=map_location), url)


def allow_mmengine_checkpoints():
    """Route mmengine's checkpoint loading through the safe readers and the fit check (idempotent).

    * local files (``CheckpointLoader`` scheme ``''``): the runner reader;
    * URLs: ``mmengine.runner.checkpoint.load_url`` downloads, then the runner reader;
    * ``mmengine.runner.checkpoint.load_state_dict``: checked by
      :func:`mmeffvit.utils.checkpoint_fit.guard_load_state_dict` first. It is the one function
      every mmengine path into a model goes through (``Runner.load_checkpoint`` for ``load_from``,
      ``tools/test.py`` and ``--resume``, ``mmengine.runner.load_checkpoint`` used by the
      toolboxes' scripts and Inferencers), looked up by name at call time, so patching it here
      also covers the callers that imported ``_load_checkpoint_to_model`` directly.
    """
    import mmengine.runner.checkpoint as mm_checkpoint
    from .checkpoint_fit import guard_load_state_dict
    mm_checkpoint.CheckpointLoader.register_scheme(
        prefixes='', loader=_mmengine_local_loader, force=True)
    mm_checkpoint.load_url = _safe_load_url
    mm_checkpoint.load_state_dict = guard_load_state_dict(mm_checkpoint.load_state_dict)


def unwrap_state_dict(ckpt, prefix=None, whole_model=False):
    """Return the weights of a checkpoint in any common layout, as a plain ``{name: tensor}``.

    Accepts OpenMMLab files (``'state_dict'``), official training files (``'model'``, also
    ``'state_dict_ema'`` as a last resort) and raw state dicts. Strips DDP's ``module.`` prefix.
    With ``prefix`` (e.g. ``'backbone.'``), keeps only the keys under it, prefix removed;
    without, keeps only ``backbone.*`` when the file is a whole detector/segmentor, unless
    ``whole_model`` (every key kept: a classifier's ``backbone.*`` and ``head.*``).
    """
    if not isinstance(ckpt, dict):
        raise TypeError(f'a checkpoint must be a dict, got {type(ckpt).__name__}')
    for key in ('state_dict', 'model', 'state_dict_ema'):
        if key in ckpt and isinstance(ckpt[key], dict):
            ckpt = ckpt[key]
            break
    sd = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in ckpt.items()}
    if prefix:
        sd = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
        if not sd:
            raise KeyError(f'no key of the checkpoint starts with prefix {prefix!r}')
    elif not whole_model and any(k.startswith('backbone.') for k in sd):
        sd = {k[len('backbone.'):]: v for k, v in sd.items() if k.startswith('backbone.')}
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f'checkpoint entries are not tensors: {bad[:5]}')
    return sd
