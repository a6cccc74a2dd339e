"""Helpful errors for unknown component names and architectures."""
import difflib
import re

from mmengine.registry import Registry

_MARKER = 'mmeffvit registers'
_NOT_FOUND = re.compile(r'^(?P<type>\S+) is not in the (?P<scope>\S+)::(?P<name>\S+) registry')


def closest_first(name, candidates):
    """Sort ``candidates`` by similarity to ``name`` (most similar first, ties alphabetical)."""
    key = name.lower().split('.')[-1]

    def score(c):
        return difflib.SequenceMatcher(None, key, c.lower()).ratio()

    return sorted(candidates, key=lambda c: (-score(c), c))


class MessageKeyError(KeyError):
    """A ``KeyError`` that prints its message as written.

    ``str(KeyError(msg))`` is ``repr(msg)``: quoted, with line breaks shown as a literal ``\\n``.
    mmengine re-raises build errors as ``type(err)(...)``, so the class carries through.
    """

    def __str__(self):
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


def unknown_choice_error(kind, value, choices):
    """A ``KeyError`` naming the valid ``choices`` for ``kind``, closest to ``value`` first."""
    ordered = closest_first(str(value), list(choices))
    return MessageKeyError(f'Unknown {kind} {value!r}; choose one of: {", ".join(ordered)}')


def _augment(err):
    """Append mmeffvit's model names to a registry "not found" KeyError about a model."""
    msg = err.args[0] if err.args and isinstance(err.args[0], str) else None
    if msg is None or _MARKER in msg:
        return None
    match = _NOT_FOUND.match(msg)
    if match is None or match.group('name') != 'model':
        return None
    from ..registry import mmeffvit_model_names
    names = closest_first(match.group('type'), mmeffvit_model_names())
    hint = (f'\n{_MARKER} (closest first): {", ".join(names)}. Use the plain name or '
            "'mmeffvit.<Name>', and keep custom_imports=dict(imports=['mmeffvit']) in the config.")
    return MessageKeyError(msg + hint)


def install_registry_hints():
    """Make every registry's ``build`` list mmeffvit's names when a model type is unknown.

    mmengine has no hook for its "not in the registry" error, and the registries of mmdet, mmseg
    and mmpretrain capture their build function when they are created, so the method is wrapped
    on the class once. Only the error path changes.
    """
    if getattr(Registry.build, '_mmeffvit_hint', False):
        return
    original = Registry.build

    def build(self, cfg, *args, **kwargs):
        try:
            return original(self, cfg, *args, **kwargs)
        except KeyError as err:
            better = _augment(err)
            if better is None:
                raise
            raise better from None

    build._mmeffvit_hint = True
    build.__doc__ = original.__doc__
    Registry.build = build
