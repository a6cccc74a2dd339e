"""The two readers behind :func:`mmeffvit.utils.checkpoint.load_checkpoint_file`.

A ``torch.save`` file is a pickle: unpickled in full it can call any function (``os.system``,
``exec`` reached through a ``getattr`` chain ...). Neither reader calls anything but an allow-list:

* **runner reader** (:func:`read_runner_file`): torch's ``weights_only`` unpickler, which
  restricts globals, calls and ``BUILD`` targets, with the few objects mmengine's runner writes
  allow-listed for the duration of the load only: numpy arrays/scalars/dtypes, ``HistoryBuffer``
  (its state checked) and a ``getattr`` that only returns ``HistoryBuffer``'s own statistics
  methods (the buffer pickles them as ``getattr(HistoryBuffer, 'mean')``);
* **tensors-only reader** (:func:`read_tensors_only`): the same allow-list, plus inert stand-ins
  for unknown classes that a file rebuilds without calling them (argparse / yacs objects of
  official training files); their state is dropped and only dicts of tensors are returned. A file
  that calls an unknown function is refused.
"""
import _compat_pickle
import pickle
import re
import types
from collections import OrderedDict

import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer

#: environment variable that lets files the user trusts be unpickled in full
TRUST_ENV = 'MMEFFVIT_TRUST_CHECKPOINTS'


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The file holds objects that the safe readers refuse (they could run code)."""


class CorruptCheckpointError(RuntimeError):
    """The file is cut, empty or not a checkpoint."""


class _Refused(Exception):
    """Raised inside the unpickler; not an UnpicklingError, so torch passes it through as is."""


# -- runner reader: what mmengine's runner writes, allow-listed ---------------------------------
#: statistics HistoryBuffer registers itself (mmengine's _set_default_statistics)
_BUFFER_STATISTICS = ('min', 'max', 'current', 'mean')
_BUFFER_STATE_KEYS = {'max_length', '_log_history', '_count_history', 'statistics_methods'}


class _CheckedHistoryBuffer(HistoryBuffer):
    """``HistoryBuffer`` as the unpickler builds it: its state is checked before it is set.

    ``HistoryBuffer.__setstate__`` merges the pickled ``statistics_methods`` into a dict shared
    by every buffer of the process, so only the buffer's own methods may be there. Once built the
    object becomes a plain ``HistoryBuffer`` (saving it again writes the usual global).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.__class__ = HistoryBuffer

    def __setstate__(self, state):
        if not isinstance(state, dict) or set(state) - _BUFFER_STATE_KEYS:
            raise _Refused(f'a HistoryBuffer with unexpected state '
                           f'{sorted(map(str, state)) if isinstance(state, dict) else type(state)}')
        for key in ('_log_history', '_count_history'):
            if key in state and type(state[key]) is not np.ndarray:
                raise _Refused(f'a HistoryBuffer whose {key} is a {type(state[key]).__name__}')
        methods = state.get('statistics_methods', {})
        if not isinstance(methods, dict) or any(
                type(name) is not str or name not in _BUFFER_STATISTICS
                or fn is not vars(HistoryBuffer)[name]
                for name, fn in methods.items()):
            raise _Refused('a HistoryBuffer with foreign statistics methods')
        self.__class__ = HistoryBuffer
        HistoryBuffer.__setstate__(self, dict(state))


def _buffer_statistic(obj, name):
    """``builtins.getattr`` in runner files: only ``getattr(HistoryBuffer, <statistic>)``."""
    if (obj is HistoryBuffer or obj is _CheckedHistoryBuffer) and type(name) is str \
            and name in _BUFFER_STATISTICS:
        return vars(HistoryBuffer)[name]
    what = obj.__qualname__ if isinstance(obj, type) else type(obj).__name__
    what = 'HistoryBuffer' if what == '_CheckedHistoryBuffer' else what
    raise _Refused(f'getattr({what}, {name!r}) (only HistoryBuffer statistics are allowed)')


def _numpy_globals():
    """numpy's picklers of arrays, scalars and dtypes, under their numpy 1.x and 2.x names."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray
    found = [(np.ndarray, 'numpy.ndarray'), (np.dtype, 'numpy.dtype')]
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        found += [(multiarray._reconstruct, f'{module}._reconstruct'),
                  (multiarray.scalar, f'{module}.scalar')]
    # numpy >= 1.25 pickles dtypes as instances of per-type classes (numpy.dtypes.Float64DType)
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        found += [(getattr(dtypes, n), f'numpy.dtypes.{n}') for n in dir(dtypes)
                  if n.endswith('DType')]
    return found


def _runner_globals():
    """``(object, name in the pickle)`` allowed beyond torch's own list for runner files."""
    hb = 'mmengine.logging.history_buffer.HistoryBuffer'
    return [(_buffer_statistic, 'builtins.getattr'), (_CheckedHistoryBuffer, hb)] + _numpy_globals()


_REFUSAL_MARKS = ('Unsupported global', 'unrecognized function', 'Can only build',
                  'Can only create new object', 'is blocked')


def read_runner_file(path, map_location):
    """torch's weights_only reader with the runner's objects allowed for this load only."""
    with torch.serialization.safe_globals(_runner_globals()):
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except _Refused as err:
            raise _refusal(path, _scan_globals(path), str(err)) from None
        except pickle.UnpicklingError as err:
            text = str(err)
            detail = _torch_detail(text)
            if not any(mark in text for mark in _REFUSAL_MARKS):
                raise corrupt_error(path, detail) from None
            found = _scan_globals(path) or re.findall(r'GLOBAL (\S+) (?:was not|whose)', text)
            raise _refusal(path, found, detail) from None


def _torch_detail(text):
    """The informative line of torch's weights_only error (the rest is advice for torch.load)."""
    lines = [line.replace('WeightsUnpickler error:', '').strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith(
        ('Weights only load failed', 'Check the documentation', '(1)', '(2)', 'In PyTorch'))]
    found = [line for line in lines if any(mark in line for mark in _REFUSAL_MARKS)]
    return (found or lines or [text])[0].split('. Please use')[0]


def _scan_globals(path):
    """Globals of a zip checkpoint that the runner reader does not allow (read, never run)."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # legacy (non-zip) format: the caller falls back to torch's message
        return []
    # the scan reports protocol-2 module names (commands.call is subprocess.call)
    renamed = []
    for name in found:
        module, _, attr = name.rpartition('.')
        renamed.append(f'{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{attr}')
    return sorted(renamed)


def _refusal(path, refused, detail, tensors_only=False):
    what = f'globals that the safe reader does not allow: {refused}' if refused else 'objects ' \
        'that the safe reader does not allow'
    text = f'checkpoint {path} was refused: it holds {what} (refused: {detail}). '
    if tensors_only:
        text += 'Reading only its tensors would also mean calling them. '
    else:
        text += "Files written by mmengine's runner and plain state dicts load without this. "
    text += (f'If you trust the source of the file, allow a full load with --trust-checkpoint '
             f'(tools/train.py, tools/test.py, the converters) or {TRUST_ENV}=1.')
    if not tensors_only:
        text += (" To take only its weights, pass it as a backbone's init_cfg=dict("
                 'type="Pretrained", checkpoint=...) or convert it with '
                 'tools/model_converters/flatten2mmeffvit.py, which read tensors only.')
    return UnsafeCheckpointError(text)


def corrupt_error(path, err):
    detail = err if isinstance(err, str) else f'{type(err).__name__}: {str(err).splitlines()[0]}'
    return CorruptCheckpointError(
        f'checkpoint {path} is corrupt or truncated and cannot be read ({detail})')


# -- tensors-only reader ------------------------------------------------------------------------
#: unknown globals that files call (REDUCE) to rebuild plain values; their stand-ins accept it
_HARMLESS_CALLS = {
    'collections.defaultdict', 'collections.deque', 'datetime.datetime', 'datetime.date',
    'datetime.time', 'datetime.timedelta', 'datetime.timezone', 'pathlib.PosixPath',
    'pathlib.WindowsPath', 'pathlib.PurePosixPath', 'pathlib.PureWindowsPath', 'builtins.slice',
    'builtins.range', 'builtins.frozenset'
}


class _StandIn(type):
    """Metaclass of the stand-ins: calling one (REDUCE) is refused unless it is harmless.

    ``NEWOBJ`` (how protocol 2 rebuilds a plain object such as ``argparse.Namespace`` or a yacs
    ``CfgNode``) calls ``cls.__new__`` directly and so gets an inert instance; a file that calls
    an unknown function (``posix.system``, ``builtins.exec`` ...) is stopped here.
    """

    def __call__(cls, *args, **kwargs):
        if cls.global_name in _HARMLESS_CALLS:
            return cls.__new__(cls)
        raise _Refused(f'a call of {cls.global_name}')


class _Inert(metaclass=_StandIn):
    """Instance of a stand-in: takes anything, keeps nothing."""
    global_name = '?'

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    # the unpickler fills containers through these; an inert one drops what it is given
    def __setitem__(self, key, value):
        pass

    def append(self, item):
        pass

    def extend(self, items):
        pass

    def add(self, item):
        pass

    def __repr__(self):
        return f'<ignored {self.global_name}>'


def _inert_reconstructor(cls, base, state):
    """``copyreg._reconstructor`` (protocol 0/1 objects) for stand-ins only."""
    if not isinstance(cls, _StandIn):
        raise _Refused(f'copyreg._reconstructor of {getattr(cls, "__name__", type(cls))}')
    return cls.__new__(cls)


def _build_tensors_only(unpickler):
    """``BUILD`` opcode: state of stand-ins is dropped; other types as torch's own reader does."""
    state = unpickler.stack.pop()
    inst = unpickler.stack[-1]
    if isinstance(inst, _Inert):
        return
    if type(inst) is OrderedDict:
        inst.__dict__.update(state)  # a state dict's _metadata (module versions)
    elif type(inst) is torch.Tensor:
        inst.set_(*state)  # legacy serialization
    elif type(inst) is torch.nn.Parameter or type(inst) in unpickler.allowed_types:
        if hasattr(inst, '__setstate__'):
            inst.__setstate__(state)
        else:
            inst.__dict__.update(state)
    else:
        raise _Refused(f'setting the state of a {type(inst).__name__}')


class _TensorsOnlyUnpickler(pickle._Unpickler):
    """Unpickler of the runner reader's globals, with inert stand-ins for unknown classes.

    Pure Python, because its ``BUILD`` can be restricted (the C unpickler sets attributes on any
    object, classes included). Callables reach the stack only through :meth:`find_class`: torch's
    tensor rebuilders, plain containers, the runner's checked objects and the stand-ins.
    """
    dispatch = dict(pickle._Unpickler.dispatch)
    dispatch[pickle.BUILD[0]] = _build_tensors_only
    ignored = None  # set per load: names of the globals replaced by stand-ins
    allowed = None

    def find_class(self, module, name):
        if self.proto < 3 and self.fix_imports:  # protocol-2 files name Python 2 modules
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        full = f'{module}.{name}'
        if self.allowed is None:
            self.allowed = dict(torch._weights_only_unpickler._get_allowed_globals())
            self.allowed.update((n, obj) for obj, n in _runner_globals())
            self.allowed_types = {v for v in self.allowed.values() if isinstance(v, type)}
        if full in self.allowed:
            return self.allowed[full]
        if full == 'copyreg._reconstructor':
            return _inert_reconstructor
        self.ignored.add(full)
        return _StandIn('Ignored', (_Inert, ), {'global_name': full})


def read_tensors_only(path, map_location):
    """Every dict of tensors in the file (nesting kept) and the names of the ignored globals."""
    ignored = set()

    class Unpickler(_TensorsOnlyUnpickler):
        pass

    Unpickler.ignored = ignored
    module = types.ModuleType('mmeffvit_tensors_only_pickle')
    module.Unpickler = Unpickler
    module.load = lambda file, **kwargs: Unpickler(file, **kwargs).load()
    module.UnpicklingError = pickle.UnpicklingError
    try:
        obj = torch.load(path, map_location=map_location, pickle_module=module,
                         weights_only=False)
    except _Refused as err:
        raise _refusal(path, sorted(ignored), str(err), tensors_only=True) from None
    return _keep_tensors(obj), sorted(ignored)


def _keep_tensors(obj):
    if isinstance(obj, torch.Tensor):
        return obj
    if not isinstance(obj, dict):
        return None
    kept = OrderedDict()
    for key, value in obj.items():
        value = _keep_tensors(value)
        if isinstance(value, torch.Tensor) or value:
            kept[key] = value
    if isinstance(getattr(obj, '_metadata', None), dict):
        kept._metadata = obj._metadata
    return kept
