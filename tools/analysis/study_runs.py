"""Seeded training runs for the studies (pretrain_study.py, learning_table.py): one config file
and one ``tools/train.py`` process per run, and what the run's logs say afterwards.

Each run gets a generated config in its work dir that inherits a repository config by absolute
path and adds the run's overrides, a seed (``randomness.seed``, ``deterministic=True``: on a CPU
the same config gives the same numbers) and :class:`mmeffvit.engine.cost_hook.IterCostHook` (CPU
seconds per iteration and peak memory, logged beside the loss). A run whose work dir already
holds ``summary.json`` for the same config is not trained again, so an interrupted study resumes
where it stopped; a run that fails stops the study with the tail of its log. "The same config"
is checked twice: the generated text, and the config mmengine resolves from it (bases included),
so that an edit to a repository config the run inherits retrains it.
"""
import hashlib
import json
import math
import os
import os.path as osp
import pprint
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from plot_logs import Run, find_scalar_logs  # noqa: E402

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
COST_IMPORTS = ['mmeffvit', 'mmeffvit.engine.cost_hook']


class StudyError(RuntimeError):
    """A run failed or left no usable log."""


def repo_path(path):
    return path if osp.isabs(path) else osp.join(REPO, path)


def config_text(base, seed, overrides=None, extra_imports=()):
    """Text of a config inheriting ``base`` (a repository path) with ``overrides`` applied.

    ``overrides`` maps top-level config keys to values merged into the base's (mmengine's rules:
    dicts merge, ``_delete_=True`` replaces, lists replace).
    """
    lines = [f'_base_ = [{repo_path(base)!r}]',
             f'custom_imports = dict(imports={COST_IMPORTS + list(extra_imports)!r}, '
             'allow_failed_imports=False)',
             "custom_hooks = [dict(type='IterCostHook')]",
             f'randomness = dict(seed={int(seed)}, deterministic=True)']
    for key, value in (overrides or {}).items():
        lines.append(f'{key} = {pprint.pformat(value, width=96, sort_dicts=False)}')
    return '\n'.join(lines) + '\n'


def resolved_digest(text):
    """sha256 of the config mmengine resolves from ``text``, its ``_base_`` files included."""
    from mmengine.config import Config
    with tempfile.TemporaryDirectory() as tmp:
        path = osp.join(tmp, 'run_config.py')
        with open(path, 'w', encoding='utf-8') as f:
            f.write(text)
        cfg = Config.fromfile(path, import_custom_modules=False)
    return hashlib.sha256(cfg.pretty_text.encode()).hexdigest()


def _reusable(work_dir, summary, digest, resolved, log):
    """Whether the finished run ``summary`` was trained from this config; refreshes what its
    summary holds (summaries of older versions lack fields that its logs give)."""
    if summary.get('config_sha256') != digest:
        return None
    stored = summary.get('resolved_sha256')
    if stored is not None and stored != resolved:
        log(f'  {work_dir}: a config it inherits changed since it was trained: training again')
        return None
    if stored is None:
        log(f'  {work_dir}: its summary predates the resolved-config check; reused on its config '
            'text alone (--fresh retrains)')
    refreshed = dict(summarise(work_dir), config_sha256=digest, resolved_sha256=resolved)
    if 'wall_s' in summary:
        refreshed['wall_s'] = summary['wall_s']
    if refreshed != summary:
        _write_summary(work_dir, refreshed)
    log(f'  {work_dir}: done before, reusing its logs')
    return refreshed


def _write_summary(work_dir, summary):
    with open(osp.join(work_dir, 'summary.json'), 'w', encoding='utf-8') as f:
        json.dump(summary, f, indent=1)


def train(work_dir, text, log=print, fresh=False):
    """Train the config ``text`` in ``work_dir`` (skipped when done before); its summary."""
    summary_file = osp.join(work_dir, 'summary.json')
    digest = hashlib.sha256(text.encode()).hexdigest()
    resolved = resolved_digest(text)
    if not fresh and osp.isfile(summary_file):
        with open(summary_file, encoding='utf-8') as f:
            summary = _reusable(work_dir, json.load(f), digest, resolved, log)
        if summary is not None:
            return summary
    if osp.isdir(work_dir):
        shutil.rmtree(work_dir)  # a stale or interrupted run: its logs would mix with the new
    os.makedirs(work_dir)
    cfg_file = osp.join(work_dir, 'run_config.py')
    with open(cfg_file, 'w', encoding='utf-8') as f:
        f.write(text)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    start = time.time()
    with open(osp.join(work_dir, 'train.log'), 'w', encoding='utf-8') as out:
        proc = subprocess.run(
            [sys.executable, osp.join(REPO, 'tools', 'train.py'), cfg_file, '--work-dir',
             work_dir], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.time() - start
    if proc.returncode:
        with open(osp.join(work_dir, 'train.log'), encoding='utf-8', errors='replace') as f:
            tail = ''.join(f.readlines()[-25:])
        raise StudyError(f'training in {work_dir} failed (exit {proc.returncode}):\n{tail}')
    summary = summarise(work_dir)
    summary.update(config_sha256=digest, resolved_sha256=resolved, wall_s=wall)
    _write_summary(work_dir, summary)
    log(f'  {work_dir}: {wall:.0f} s, {summary["time"]:.2f} s/iter, '
        f'{summary["peak_rss_mb"]:.0f} MiB, {summary["metrics"]}')
    return summary


def summarise(work_dir):
    """What a finished run's logs say: its last and first validation metrics (``metrics``,
    ``first_metrics`` at iteration ``first_val_iter``: how fast it starts), the mean training
    loss of its last five logged intervals (``last_loss``: how well it fits), mean s/iter (wall
    and CPU) and peak memory."""
    try:
        run = Run(osp.basename(work_dir), find_scalar_logs(work_dir))
    except (OSError, ValueError) as err:
        raise StudyError(f'{work_dir}: no usable scalar log ({err})') from err
    keys = [key for key in run.val if key not in ('time', 'data_time')]
    if not keys:
        raise StudyError(f'{work_dir}: the run logged no validation metric')
    metrics = {key: run.series(key)[1][-1] for key in keys}
    first_metrics = {key: run.series(key)[1][0] for key in keys}

    def mean_cost(key):
        # the first logged interval holds start-up work (allocations, first data loading)
        values = run.series(key)[1]
        values = values[1:] if len(values) > 1 else values
        return sum(values) / len(values) if values else math.nan

    xs, losses = run.series('loss')
    losses = losses[-5:]
    peak = run.series('peak_rss_mb')[1]
    return dict(metrics=metrics, first_metrics=first_metrics,
                first_val_iter=int(run.series(keys[0])[0][0]), iters=int(xs[-1]) if xs else 0,
                last_loss=sum(losses) / len(losses) if losses else math.nan,
                time=mean_cost('time'), cpu_time=mean_cost('cpu_time'),
                peak_rss_mb=max(peak) if peak else math.nan)


def last_checkpoint(work_dir):
    """The checkpoint a finished run saved last (mmengine's ``last_checkpoint`` pointer)."""
    pointer = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(pointer):
        raise StudyError(f'{work_dir}: no checkpoint was saved')
    with open(pointer, encoding='utf-8') as f:
        path = f.read().strip()
    if not osp.isfile(path):
        raise StudyError(f'{work_dir}: last_checkpoint names {path}, which does not exist')
    return path


def mean_std(values):
    """Mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def fmt_mean_std(values, digits=1):
    """``mean ± std`` of several values; one value alone (a single seed) has no spread."""
    mean, std = mean_std(values)
    if len(values) == 1:
        return f'{mean:.{digits}f} (one seed)'
    return f'{mean:.{digits}f} ± {std:.{digits}f}'


def plot(work_dirs, labels, out, keys, title):
    """Curves of the runs (tools/analysis/plot_logs.py) written to ``out``."""
    cmd = [sys.executable, osp.join(REPO, 'tools', 'analysis', 'plot_logs.py'), *work_dirs,
           '--labels', *labels, '--keys', *keys, '--out', out, '--title', title]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise StudyError(f'plot_logs failed: {proc.stderr.strip()}')
