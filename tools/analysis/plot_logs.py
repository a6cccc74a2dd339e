"""Training curves of one or several runs: losses and validation metrics vs iteration, as a PNG.

Reads the scalars mmengine's ``LocalVisBackend`` writes (``<work_dir>/<timestamp>/vis_data/
scalars.json``, or the timestamped ``<timestamp>.json`` beside it) of every timestamp dir in
order; a later log that starts at an earlier iteration (a resumed or restarted run) replaces the
points from there on. Examples::

    python tools/analysis/plot_logs.py work_dirs/demo/det                     # -> .../curves.png
    python tools/analysis/plot_logs.py work_dirs/a work_dirs/b --labels A B --smooth 10 \\
        --keys 'loss*' 'coco/bbox_mAP*' --out compare.png

Training scalars are drawn as lines over the logged iterations (``--smooth N`` adds a trailing
mean over N logged points, the raw values stay faint behind it); validation metrics as points at
the iteration they were measured. One panel per key, one colour per run.

Unlike mmdet's ``analyze_logs.py`` this needs only matplotlib (no seaborn) and places metrics at
iterations for iteration-based and epoch-based runs alike: mmengine logs validation scalars at
the *epoch* number unless ``log_metric_by_epoch=False`` (mmdet's configs, the detection demo
among them, keep the default), so a metric is placed at the last training iteration logged
before it when its own step lies behind that.
"""
import argparse
import fnmatch
import glob
import json
import math
import os.path as osp
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use('Agg')  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

DEFAULT_KEYS = ('*loss*', '*mAP', '*mAP_50', 'mIoU', 'mAcc', 'aAcc', '*top1')
# bookkeeping fields of mmengine's records, not curves
_NOT_CURVES = {'step', 'iter', 'epoch'}


class LogError(ValueError):
    """A work dir without logs, an unreadable log, or keys that match nothing."""


def find_scalar_logs(path):
    """The vis_data json files of a run, oldest first.

    ``path`` may be a work dir, one of its timestamp dirs, a ``vis_data`` dir or a json file.
    Each ``vis_data`` contributes ``scalars.json`` or, if absent, its ``<timestamp>.json`` (both
    hold the same records; reading both would count every point twice).
    """
    if osp.isfile(path):
        return [path]
    if not osp.isdir(path):
        raise LogError(f'{path} is neither a work dir nor a json log')
    if osp.basename(osp.normpath(path)) == 'vis_data':
        vis_dirs = [path]
    elif osp.isdir(osp.join(path, 'vis_data')):
        vis_dirs = [osp.join(path, 'vis_data')]
    else:
        vis_dirs = sorted(glob.glob(osp.join(path, '*', 'vis_data')))
    files = []
    for vis in vis_dirs:
        scalars = osp.join(vis, 'scalars.json')
        stamped = sorted(p for p in glob.glob(osp.join(vis, '*.json')) if p != scalars)
        if osp.isfile(scalars):
            files.append(scalars)
        elif stamped:
            files.append(stamped[-1])
    if not files:
        raise LogError(f'no vis_data/*.json under {path}: is it the work dir of a training run '
                       '(mmengine writes <work_dir>/<timestamp>/vis_data/scalars.json)?')
    return files


def read_records(path):
    """The json records of one log file, with the file and line of any unreadable line."""
    records = []
    with open(path, encoding='utf-8') as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise LogError(f'{path}:{lineno} is not a json record ({err.msg}); '
                               'is the file truncated or not an mmengine scalar log?') from err
            if not isinstance(record, dict):
                raise LogError(f'{path}:{lineno} holds {type(record).__name__}, not a json object')
            records.append(record)
    return records


def _is_train(record):
    # mmengine's LogProcessor puts the learning rate in every training record, never elsewhere
    return any(k == 'lr' or k.endswith('_lr') or 'loss' in k for k in record)


class Run:
    """The curves of one run: ``train[key]`` and ``val[key]`` map iteration -> value."""

    def __init__(self, label, files):
        self.label = label
        self.files = files
        self.train = OrderedDict()
        self.val = OrderedDict()
        for path in files:
            last_train_step = 0
            first = True
            for record in read_records(path):
                step = record.get('step', 0)
                if not isinstance(step, (int, float)):
                    raise LogError(f'{path}: step {step!r} is not a number')
                if _is_train(record):
                    if first:  # a run resumed (or restarted) here replaces what came after
                        self._drop_from(step)
                        first = False
                    last_train_step = step
                    target, x = self.train, step
                else:
                    # logged by epoch (step = epoch number): place it after the training so far
                    target, x = self.val, max(step, last_train_step)
                for key, value in record.items():
                    if key in _NOT_CURVES or not isinstance(value, (int, float)):
                        continue
                    target.setdefault(key, {})[x] = float(value)
        if not self.train and not self.val:
            raise LogError(f'{", ".join(files)} hold no scalar records')

    def _drop_from(self, step):
        for curves in (self.train, self.val):
            for points in curves.values():
                for x in [x for x in points if x >= step]:
                    del points[x]

    def series(self, key):
        """(iterations, values) of ``key``, sorted by iteration."""
        points = self.train.get(key) or self.val.get(key) or {}
        xs = sorted(points)
        ys = [points[x] for x in xs]
        if 'mAP' in key:  # COCO writes -1 when an area range holds no object: not a score
            ys = [math.nan if y == -1 else y for y in ys]
        return xs, ys

    def keys(self):
        return list(self.train) + [k for k in self.val if k not in self.train]


def select_keys(runs, patterns):
    """Keys of any run matching the shell-style ``patterns``, in pattern order, then log order."""
    available = []
    for run in runs:
        available += [k for k in run.keys() if k not in available]
    chosen = []
    for pattern in patterns:
        chosen += [k for k in available if fnmatch.fnmatchcase(k, pattern) and k not in chosen]
    if not chosen:
        raise LogError(f'no logged key matches {list(patterns)}; the logs hold: '
                       f'{", ".join(available)}')
    return chosen


def trailing_mean(values, window):
    """Mean of the last ``window`` finite values at each point (NaN where none is finite)."""
    out = []
    for i in range(len(values)):
        part = [v for v in values[max(0, i - window + 1):i + 1] if math.isfinite(v)]
        out.append(sum(part) / len(part) if part else math.nan)
    return out


def plot_runs(runs, keys, out, smooth=1, title=None, columns=3):
    """Draw one panel per key (one colour per run) and save the figure to ``out``."""
    columns = max(1, min(columns, len(keys)))
    rows = math.ceil(len(keys) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.6 * rows), squeeze=False)
    colours = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for ax, key in zip(axes.flat, keys):
        is_metric = all(key not in run.train for run in runs)
        for i, run in enumerate(runs):
            xs, ys = run.series(key)
            if not xs:
                continue
            colour = colours[i % len(colours)]
            if is_metric:
                ax.plot(xs, ys, marker='o', color=colour, label=run.label)
                if len(xs) == 1:  # a lone value: write it, a single dot is easy to misread
                    ax.annotate(f'{ys[0]:.4g}', (xs[0], ys[0]), textcoords='offset points',
                                xytext=(6, 6), color=colour)
            elif smooth > 1:
                ax.plot(xs, ys, color=colour, alpha=0.25, linewidth=0.8)
                ax.plot(xs, trailing_mean(ys, smooth), color=colour, linewidth=1.6,
                        label=f'{run.label} (mean of {smooth})')
            else:
                ax.plot(xs, ys, color=colour, linewidth=1.2, label=run.label)
        ax.set_title(f'{key} (validation)' if is_metric else key)
        ax.set_xlabel('iteration')
        ax.grid(alpha=0.3)
        ax.legend(fontsize='small')
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def summary_lines(runs, keys):
    """Last value of every training curve and best value of every metric, per run."""
    lines = []
    for run in runs:
        for key in keys:
            xs, ys = run.series(key)
            finite = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
            if not xs:
                continue
            if len(finite) < len(xs):
                bad = [x for x, y in zip(xs, ys) if not math.isfinite(y)]
                lines.append(f'{run.label}: {key} is not finite at iterations {bad[:10]}')
            if not finite:
                continue
            if key in run.train:
                lines.append(f'{run.label}: {key} {finite[-1][1]:.4g} at iteration '
                             f'{finite[-1][0]:g} (first {finite[0][1]:.4g})')
            else:
                best = max(finite, key=lambda p: p[1])
                lines.append(f'{run.label}: {key} best {best[1]:.4g} at iteration {best[0]:g}, '
                             f'last {finite[-1][1]:.4g}')
    return lines


def default_labels(paths):
    """The shortest path tails that tell the runs apart."""
    parts = [osp.normpath(osp.abspath(p)).split(osp.sep) for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ['/'.join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(i) for i in range(len(paths))]


def build_parser():
    parser = argparse.ArgumentParser(
        description='Plot losses and metrics vs iteration from mmengine vis_data logs')
    parser.add_argument('runs', nargs='+', metavar='WORK_DIR',
                        help='work dirs (or timestamp dirs, vis_data dirs, json logs)')
    parser.add_argument('--keys', nargs='+', default=list(DEFAULT_KEYS), metavar='PATTERN',
                        help='shell-style patterns of the scalars to draw (default: %(default)s)')
    parser.add_argument('--labels', nargs='+', help='legend label of each run')
    parser.add_argument('--smooth', type=int, default=1, metavar='N',
                        help='draw training curves as a trailing mean of N logged points')
    parser.add_argument('--out', help='PNG to write (default: <WORK_DIR>/curves.png for one '
                        'run, curves.png for several)')
    parser.add_argument('--title', help='figure title')
    parser.add_argument('--columns', type=int, default=3, help='panels per row')
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.labels and len(args.labels) != len(args.runs):
        parser.error(f'{len(args.labels)} labels for {len(args.runs)} runs')
    if args.smooth < 1:
        parser.error('--smooth must be >= 1')
    labels = args.labels or default_labels(args.runs)
    try:
        runs = [Run(label, find_scalar_logs(path)) for label, path in zip(labels, args.runs)]
        keys = select_keys(runs, args.keys)
    except (LogError, OSError) as err:
        print(f'plot_logs: {err}', file=sys.stderr)
        return 1
    out = args.out
    if out is None:
        single = args.runs[0] if osp.isdir(args.runs[0]) else osp.dirname(args.runs[0])
        out = osp.join(single, 'curves.png') if len(args.runs) == 1 else 'curves.png'
    plot_runs(runs, keys, out, smooth=args.smooth, title=args.title, columns=args.columns)
    for line in summary_lines(runs, keys):
        print(line)
    print(f'curves of {len(runs)} run(s), {len(keys)} key(s) written to {out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
