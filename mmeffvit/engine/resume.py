"""Choosing the checkpoint ``--resume`` continues from.

mmengine resumes from the file named in ``<work_dir>/last_checkpoint`` and fails on it when it is
truncated, or logs "Auto resumed from the latest checkpoint None." and starts afresh when there is
none. Here each candidate is checked first (torch checkpoints are zip archives with a CRC per
entry, so truncation and corruption show without unpickling anything) and the newest intact one
is taken, with a warning for every one passed over.
"""
import os
import os.path as osp
import re
import zipfile
from typing import List, Optional, Tuple

# CheckpointHook's default file names
_CHECKPOINT_NAME = re.compile(r'^(epoch|iter)_(\d+)\.pth$')


def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be resumed from, or ``None`` if it is an intact torch checkpoint."""
    if not osp.isfile(path):
        return 'the file does not exist'
    if osp.getsize(path) == 0:
        return 'the file is empty (0 bytes)'
    try:
        with zipfile.ZipFile(path) as archive:
            broken = archive.testzip()
    except zipfile.BadZipFile:
        return ('the file is truncated or not a torch checkpoint (no complete zip archive; was '
                'the process killed while saving it?)')
    except OSError as err:
        return f'the file cannot be read ({err})'
    if broken is not None:
        return f'the file is corrupt (checksum mismatch in {broken!r})'
    return None


def _step(path: str) -> Tuple[int, int]:
    match = _CHECKPOINT_NAME.match(osp.basename(path))
    return (int(match.group(2)), 1 if match.group(1) == 'iter' else 0) if match else (-1, 0)


def _checkpoints_in(folders) -> List[str]:
    found = set()
    for folder in folders:
        if folder and osp.isdir(folder):
            found.update(osp.join(folder, name) for name in os.listdir(folder)
                         if _CHECKPOINT_NAME.match(name))
    return sorted(found, key=lambda p: (_step(p), osp.getmtime(p)), reverse=True)


def find_resume_checkpoint(work_dir: str) -> Tuple[Optional[str], List[str]]:
    """The newest intact checkpoint of ``work_dir`` and the warnings to show about the others.

    The file ``last_checkpoint`` names comes first; if it is missing or damaged, the numbered
    checkpoints (``iter_N.pth``/``epoch_N.pth``) of its folder and of ``work_dir`` are tried from
    the newest down (older than the named one, when it has a number).

    Returns:
        tuple: the checkpoint path (``None`` if there is none) and a list of messages.
    """
    notes = []
    named = None
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        with open(pointer) as f:
            named = f.read().strip() or None
    folders = [work_dir] + ([osp.dirname(named)] if named else [])
    candidates = _checkpoints_in(folders)
    if named is not None:
        problem = checkpoint_problem(named)
        if problem is None:
            return named, notes
        notes.append(f'cannot resume from {named}, which {pointer} names: {problem}')
        if _step(named)[0] >= 0:
            candidates = [p for p in candidates if _step(p) < _step(named)]
        candidates = [p for p in candidates if osp.abspath(p) != osp.abspath(named)]
    elif candidates:
        notes.append(f'{pointer} does not exist; looking for checkpoints in {work_dir}')
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            notes.append(f'resuming from {path}, the newest intact checkpoint, instead')
            return path, notes
        notes.append(f'skipping {path}: {problem}')
    notes.append(f'no checkpoint to resume from in {work_dir}: training starts from the '
                 'beginning')
    return None, notes
