"""Checkpoint loading that works with torch >= 2.6 and with official (non-OpenMMLab) layouts.

torch >= 2.6 unpickles with ``weights_only=True`` by default. mmengine 0.10.7 checkpoints store
``HistoryBuffer`` objects (numpy arrays, and bound statistics methods pickled through
``builtins.getattr``) in their message hub, so ``--resume``, ``tools/test.py``, ``load_from``,
``init_cfg=Pretrained`` and the toolboxes' own test scripts all fail to read them.
:func:`allow_mmengine_checkpoints` runs when mmeffvit is imported (every config imports it through
``custom_imports`` before any checkpoint is read) and makes mmengine's local-file loader use
:func:`load_checkpoint_file`: the safe loader first, with the harmless numpy/HistoryBuffer classes
allow-listed; a full unpickle only when every refused global is one that mmengine's own runner
writes (``getattr`` cannot be allow-listed safely, so such files are trusted as mmengine trusted
them before torch 2.6); anything else is refused with an explanation.
"""
import os
import pickle
import zipfile

import numpy as np
import torch
from mmengine.logging import print_log


def _numpy_globals():
    """The numpy callables pickle needs to rebuild arrays and scalars (numpy 1.x and 2.x)."""
    found = [np.ndarray, np.dtype]
    for mod_name in ('numpy._core.multiarray', 'numpy.core.multiarray'):
        try:
            mod = __import__(mod_name, fromlist=['_reconstruct'])
        except ImportError:
            continue
        found += [mod._reconstruct, mod.scalar]
        break
    # numpy >= 1.25 pickles dtypes as instances of per-type classes (numpy.dtypes.Float64DType)
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        found += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith('DType')]
    return found


# what mmengine's runner pickles besides tensors (numpy.dtypes.*DType classes are matched apart)
_RUNNER_GLOBALS = {
    'mmengine.logging.history_buffer.HistoryBuffer', 'builtins.getattr', 'numpy.dtype',
    'numpy.ndarray', 'numpy._core.multiarray._reconstruct', 'numpy.core.multiarray._reconstruct',
    'numpy._core.multiarray.scalar', 'numpy.core.multiarray.scalar'
}


def _written_by_mmengine(unsupported):
    return all(g in _RUNNER_GLOBALS or g.startswith('numpy.dtypes.') for g in unsupported)


def _mmengine_local_loader(filename, map_location=None):
    """Replacement of mmengine's loader for local paths (same contract: path, map_location)."""
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return load_checkpoint_file(filename, map_location=map_location, trust=False)


def allow_mmengine_checkpoints():
    """Make checkpoints written by mmengine's runner loadable under torch >= 2.6 (idempotent)."""
    from mmengine.logging.history_buffer import HistoryBuffer
    from mmengine.runner.checkpoint import CheckpointLoader
    torch.serialization.add_safe_globals([HistoryBuffer] + _numpy_globals())
    CheckpointLoader.register_scheme(prefixes='', loader=_mmengine_local_loader, force=True)


def load_checkpoint_file(path, map_location='cpu', trust=True):
    """Load a checkpoint file with clear errors for missing, corrupt and unsafe files.

    Args:
        path (str): Local file path.
        map_location: Passed to :func:`torch.load`.
        trust (bool): Whether the file may be unpickled in full when the safe loader refuses
            objects other than those mmengine's runner writes (official training files hold
            yacs/argparse objects). A warning names what was refused.

    Returns:
        The unpickled object.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path}')
    if os.path.getsize(path) == 0:
        raise RuntimeError(f'checkpoint {path} is empty (0 bytes): the download or save was cut')
    corrupt = (pickle.UnpicklingError, RuntimeError, zipfile.BadZipFile, EOFError, ValueError)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if 'Unsupported global' not in str(err):
            raise _corrupt(path, err) from err
        refused = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        if not _written_by_mmengine(refused):
            if not trust:
                raise pickle.UnpicklingError(
                    f'{path} holds objects that the safe loader refuses: {sorted(refused)}. '
                    'Only load it if you trust its source: save its weights as a plain state dict, '
                    'or pass it as init_cfg=dict(type="Pretrained", ...) of an mmeffvit backbone '
                    '(which trusts the local files it is given).') from err
            print_log(f'{path} holds objects beyond tensors ({sorted(refused)}); loading it with '
                      'weights_only=False because it was given as a trusted local file',
                      logger='current', level=30)
        try:
            return torch.load(path, map_location=map_location, weights_only=False)
        except corrupt as err2:
            raise _corrupt(path, err2) from err2
    except corrupt as err:
        raise _corrupt(path, err) from err


def _corrupt(path, err):
    return RuntimeError(f'checkpoint {path} is corrupt or truncated and cannot be read '
                        f'({type(err).__name__}: {str(err).splitlines()[0]})')


def unwrap_state_dict(ckpt, prefix=None):
    """Return the weights of a checkpoint in any common layout, as a plain ``{name: tensor}``.

    Accepts OpenMMLab files (``'state_dict'``), official training files (``'model'``, also
    ``'state_dict_ema'`` as a last resort) and raw state dicts. Strips DDP's ``module.`` prefix.
    With ``prefix`` (e.g. ``'backbone.'``), keeps only the keys under it, prefix removed;
    without, keeps only ``backbone.*`` when the file is a whole detector/segmentor.
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
    elif any(k.startswith('backbone.') for k in sd):
        sd = {k[len('backbone.'):]: v for k, v in sd.items() if k.startswith('backbone.')}
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f'checkpoint entries are not tensors: {bad[:5]}')
    return sd
