"""How tools/train.py and tools/test.py report errors.

A wrong config or data set is the user's to fix, and a 20-frame traceback through mmengine hides
the one line that says what is wrong. :func:`run_cli` prints such errors as one message, without
traceback (``--debug`` or ``MMEFFVIT_DEBUG=1`` shows it), and keeps the traceback for everything
else. Under torchrun each rank's error also goes to torchrun's error file, so its failure summary
shows the rank that failed first and its message, not "error_file: <N/A>".
"""
import json
import os
import pickle
import signal
import sys
import time
import traceback
from typing import Callable, Optional


class DataError(ValueError):
    """A data set, annotation file or image cannot be used as it is."""


class ConfigError(ValueError):
    """A command-line option cannot be applied to the given config."""


class NonFiniteLossError(FloatingPointError):
    """A loss became NaN or infinite during training."""


DEBUG_ENV = 'MMEFFVIT_DEBUG'

# Errors that are a message by design: raised from these functions they concern the config
_CONFIG_FRAMES = ('build_from_cfg', 'fromfile', '_file2dict', 'import_modules_from_strings')
# Types that, raised by mmeffvit's own code, are deliberate messages (a bug raises others)
_MESSAGE_TYPES = (ValueError, KeyError, TypeError, FileNotFoundError, NotImplementedError)
# gloo's words when a peer process died
_PEER_GONE = ('Connection closed by peer', 'Connection reset by peer',
              'remote worker crashing')


def _frames(err: BaseException):
    tb = err.__traceback__
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _mmeffvit_file(filename: str) -> bool:
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.abspath(filename).startswith(package + os.sep)


def _message(err: BaseException) -> str:
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    if 'Original Traceback' in text:
        # re-raised from a dataloader worker: keep the worker's final "Type: message" lines
        lines = text.rstrip().splitlines()
        starts = [i for i, line in enumerate(lines)
                  if line.split(':', 1)[0].split('.')[-1] == type(err).__name__]
        if starts:
            text = '\n'.join(lines[starts[-1]:]).split(':', 1)[1].strip()
    # KeyError subclasses exist only to print their message plainly (utils/suggest.py)
    name = 'KeyError' if isinstance(err, KeyError) else type(err).__name__
    return f'{name}: {text}'


def user_error_message(err: BaseException) -> Optional[str]:
    """The message to print for ``err`` if it is a user's error, else ``None``."""
    if isinstance(err, (ConfigError, DataError, NonFiniteLossError, pickle.UnpicklingError,
                        FileNotFoundError, IsADirectoryError, NotADirectoryError, SyntaxError,
                        ModuleNotFoundError)):
        return _message(err)
    if type(err).__module__.startswith('mmeffvit.'):
        return _message(err)
    frames = list(_frames(err))
    if isinstance(err, (*_MESSAGE_TYPES, AssertionError)) and any(
            f.f_code.co_name in _CONFIG_FRAMES for f in frames):
        return _message(err)
    if isinstance(err, _MESSAGE_TYPES) and frames and _mmeffvit_file(
            frames[-1].f_code.co_filename):
        return _message(err)
    return None


def _peer_failure(err: BaseException) -> bool:
    text = str(err)
    return isinstance(err, RuntimeError) and any(words in text for words in _PEER_GONE)


def _rank_prefix() -> str:
    world = int(os.environ.get('WORLD_SIZE', '1'))
    return f"[rank {os.environ.get('RANK', '0')}] " if world > 1 else ''


def _record_for_torchrun(message: str, callstack: str, delay: int = 0) -> None:
    """Write torchrun's error file (its ``record`` format) if torchrun asked for one.

    ``delay`` puts the time stamp later: torchrun names the failure with the smallest time stamp
    as the root cause, and a rank that stops because a peer died is not it.
    """
    path = os.environ.get('TORCHELASTIC_ERROR_FILE')
    if not path:
        return
    data = dict(message=dict(message=message, extraInfo=dict(
        py_callstack=callstack, timestamp=str(int(time.time()) + delay))))
    try:
        with open(path, 'w') as f:
            json.dump(data, f)
    except OSError:
        pass


class LauncherStopped(BaseException):
    """torchrun ended this process (SIGTERM): a peer failed or the run was cancelled.

    A ``BaseException``, like ``KeyboardInterrupt``, so that no ``except Exception`` swallows it.
    """


def _say_stopped_by_peer(message: str) -> None:
    """One line on this rank; torchrun's record time-stamped after the failing rank's."""
    _ignore_sigterm()
    _record_for_torchrun(message, message, delay=1)
    print(f'{_rank_prefix()}{message}', file=sys.stderr, flush=True)


def _stop_on_sigterm(signum, frame):
    raise LauncherStopped()


def _ignore_sigterm() -> None:
    """While this rank reports why it stops: a peer's error reaches it first, torchrun's
    SIGTERM follows 0.1 s later and would raise :class:`LauncherStopped` inside the handler,
    before its one line is printed (the likely cause of a surviving rank that ended without a
    word in ``test_a_failing_rank_ends_the_run_with_its_error`` under load)."""
    if signal.getsignal(signal.SIGTERM) is _stop_on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _under_torchrun() -> bool:
    return 'TORCHELASTIC_RUN_ID' in os.environ and int(os.environ.get('WORLD_SIZE', '1')) > 1


def debug_requested(argv=None) -> bool:
    argv = sys.argv[1:] if argv is None else argv
    return '--debug' in argv or os.environ.get(DEBUG_ENV, '') not in ('', '0')


def run_cli(main: Callable, argv=None):
    """Run ``main(argv)``; report a user's error in one message and exit with status 1."""
    if _under_torchrun():
        # torchrun SIGTERMs the other ranks 0.1 s after one fails, often before their next
        # collective notices the peer is gone: without a handler they die without a word
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return main(argv)
    except LauncherStopped:
        message = ('stopped: the launcher ended this process (SIGTERM) because another process '
                   'of this distributed run failed (its error is reported above and in the '
                   'summary below) or the run was cancelled')
        _say_stopped_by_peer(message)
        sys.exit(1)
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: B902 - reported below, re-raised when not a user error
        _ignore_sigterm()  # the report below must not be cut short by the launcher
        if _peer_failure(err):
            message = ('stopped: another process of this distributed run failed (its error is '
                       f'reported above and in the summary below); here: {err}')
            if not debug_requested(argv):
                _say_stopped_by_peer(message)
                sys.exit(1)
            _record_for_torchrun(message, message, delay=1)
            raise
        message = user_error_message(err)
        if message is None or debug_requested(argv):
            _record_for_torchrun(_message(err), traceback.format_exc())
            raise
        _record_for_torchrun(message, message)
        print(f'{_rank_prefix()}error: {message}\n(the full traceback: add --debug or set '
              f'{DEBUG_ENV}=1)', file=sys.stderr, flush=True)
        sys.exit(1)
