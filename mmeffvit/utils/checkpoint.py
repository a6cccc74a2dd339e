"""Checkpoint loading that works with torch >= 2.6 and with official (non-OpenMMLab) layouts.

torch >= 2.6 unpickles with ``weights_only=True`` by default. mmengine 0.10.7 checkpoints store a
``HistoryBuffer`` (numpy arrays inside) in their message hub, so ``--resume``, ``tools/test.py`` and
the toolboxes' own test scripts fail to load them. :func:`allow_mmengine_checkpoints` adds exactly
the classes such checkpoints contain to torch's allow-list; it runs when mmeffvit is imported,
which every config does through ``custom_imports`` before any checkpoint is read.
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


def allow_mmengine_checkpoints():
    """Allow-list the non-tensor objects that mmengine's runner writes into checkpoints."""
    from mmengine.logging.history_buffer import HistoryBuffer
    safe = [HistoryBuffer] + _numpy_globals()
    torch.serialization.add_safe_globals(safe)


def load_checkpoint_file(path, map_location='cpu', trust=True):
    """Load a checkpoint file with clear errors for missing and corrupt files.

    Args:
        path (str): Local file path.
        map_location: Passed to :func:`torch.load`.
        trust (bool): Whether the file may be unpickled in full when the safe loader refuses it
            (official training files hold yacs/argparse objects). A warning names the reason.

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
        # only a refused global (yacs/argparse objects in official files) is worth a full load
        if not trust or 'Unsupported global' not in str(err):
            raise _corrupt(path, err) from err
        print_log(f'{path} holds objects beyond tensors ({_first_unsupported(err)}); loading it '
                  'with weights_only=False because it was given as a trusted local file',
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


def _first_unsupported(err):
    lines = [ln for ln in str(err).splitlines() if 'Unsupported global' in ln]
    return lines[0].strip() if lines else 'unsupported objects'


def unwrap_state_dict(ckpt):
    """Return the weights of a checkpoint in any common layout, as a plain ``{name: tensor}``.

    Accepts OpenMMLab files (``'state_dict'``), official training files (``'model'``, also
    ``'state_dict_ema'`` as a last resort) and raw state dicts. Strips DDP's ``module.`` prefix,
    and keeps only ``backbone.*`` (prefix removed) when the file is a whole detector/segmentor.
    """
    if not isinstance(ckpt, dict):
        raise TypeError(f'a checkpoint must be a dict, got {type(ckpt).__name__}')
    for key in ('state_dict', 'model', 'state_dict_ema'):
        if key in ckpt and isinstance(ckpt[key], dict):
            ckpt = ckpt[key]
            break
    sd = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in ckpt.items()}
    if any(k.startswith('backbone.') for k in sd):
        sd = {k[len('backbone.'):]: v for k, v in sd.items() if k.startswith('backbone.')}
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f'checkpoint entries are not tensors: {bad[:5]}')
    return sd
