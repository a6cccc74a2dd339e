"""Tables, exponent fits and plots of ``tools/analysis/benchmark.py`` results.

Works on the JSON the benchmark writes (``results.json``), so a report can be rendered again
without measuring (``benchmark.py --from-json``). Nothing here imports torch.
"""
import math
import os.path as osp
import statistics
from collections import defaultdict

import numpy as np

MIB = 2 ** 20


def fit_exponent(pixels, values):
    """Slope ``b`` of ``log(value) = a + b·log(pixels)`` by least squares (NaN if undefined).

    ``value ∝ pixels^b``: 1 is linear in the image area, 2 quadratic (global softmax attention).
    """
    pts = [(p, v) for p, v in zip(pixels, values)
           if v is not None and p > 0 and v > 0 and math.isfinite(v)]
    if len({p for p, _ in pts}) < 2:
        return float('nan')
    x = np.log([p for p, _ in pts])
    y = np.log([v for _, v in pts])
    slope, _ = np.polyfit(x, y, 1)
    return float(slope)


def fit_growth(pixels, values):
    """Slope ``s`` of ``value = a + s·pixels`` by least squares (NaN if undefined).

    What each extra pixel adds. The exponent of :func:`fit_exponent` also reflects the constant
    part ``a`` (weights, their gradients, padding waste at small sizes): of two models that add
    the same memory per pixel, the one with the larger constant has the smaller exponent.
    """
    pts = [(p, v) for p, v in zip(pixels, values)
           if v is not None and p > 0 and math.isfinite(v)]
    if len({p for p, _ in pts}) < 2:
        return float('nan')
    slope, _ = np.polyfit([p for p, _ in pts], [v for _, v in pts], 1)
    return float(slope)


def shape_label(shape):
    h, w = shape
    return f'{h}²' if h == w else f'{h}×{w}'


def summarise(measurements):
    """``{(case, (h, w), mode): stats}`` over all rounds of backbone / detector measurements.

    ``stats``: every timed value, min and median seconds; the largest allocator and RSS peak of
    the rounds; params; and the error texts of failed rounds.
    """
    groups = defaultdict(list)
    for m in measurements:
        groups[(m['name'], tuple(m['shape']), m['mode'])].append(m['result'])
    out = {}
    for key, results in groups.items():
        ok = [r for r in results if 'error' not in r]
        times = [t for r in ok for t in r['times']]
        out[key] = dict(
            times=times, rounds=len(ok),
            min=min(times) if times else None,
            median=statistics.median(times) if times else None,
            alloc_peak=max((r['alloc_peak'] for r in ok), default=None),
            rss_peak=max((r['rss_peak'] for r in ok), default=None),
            params=ok[0]['params'] if ok else None,
            errors=sorted({r['error'] for r in results if 'error' in r}))
    return out


def round_ratios(measurements, name, peer, shape, mode):
    """Per-round ratios ``time(name) / time(peer)`` of the rounds both measured (each round's
    fastest repetition): how far one pair's ratio moves within a run, sorted."""
    best = defaultdict(dict)
    for m in measurements:
        if (m['name'] in (name, peer) and tuple(m['shape']) == tuple(shape) and m['mode'] == mode
                and 'error' not in m['result'] and m['result'].get('times')):
            best[m['round']][m['name']] = min(m['result']['times'])
    return sorted(b[name] / b[peer] for b in best.values()
                  if name in b and peer in b and b[peer] > 0)


def gemm_rate(gemm):
    """Best and median GMAC/s of the GEMM measurements of one dtype over all rounds, of the
    kernel with the best time (``kernel``; ``others``: the other kernels' best rates)."""
    ok = [g['result'] for g in gemm if 'error' not in g['result']]
    if not ok:
        return None
    macs = ok[0]['macs']
    by_kernel = {}
    for r in ok:  # runs of an older tool name no kernel: torch.mm's times
        for name, times in r.get('kernel_times', {'torch.mm': r['times']}).items():
            by_kernel.setdefault(name, []).extend(times)
    kernel = min(by_kernel, key=lambda k: min(by_kernel[k]))
    times = by_kernel[kernel]
    others = {k: macs / min(t) / 1e9 for k, t in by_kernel.items() if k != kernel}
    return dict(best=macs / min(times) / 1e9, median=macs / statistics.median(times) / 1e9,
                n=gemm[0]['n'], samples=len(times), kernel=kernel, others=others)


def _gemm_line(label, rate):
    others = ''.join(f'; {k} {v:.1f} best' for k, v in sorted(rate['others'].items()))
    return (f"{label} ({rate['n']}×{rate['n']}, {rate['samples']} runs of the fastest kernel, "
            f"{rate['kernel']}): **{rate['best']:.1f} GMAC/s** best, {rate['median']:.1f} "
            f"median{others}.")


def _fmt(value, digits=2, scale=1.0):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return '–'
    text = f'{value / scale:.{digits}f}'
    return text[1:] if text.startswith('-') and float(text) == 0 else text  # no '-0.00'


def _ratio(value, ref):
    if value is None or not ref or not math.isfinite(value / ref):
        return '–'
    return f'{value / ref:.2f}×'


def _md_table(header, rows, align=None):
    align = align or ['---'] + ['--:'] * (len(header) - 1)
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join(align) + '|']
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return lines


_GEMM_NAMES = {'onednn': 'oneDNN', 'aten': 'MKL'}  # mmeffvit.ops.policy's cpu_gemm


def _images(batch):
    return 'one image' if batch == 1 else f'{batch} images'


def _machine_lines(data):
    mach = data['machine']
    isa = f" ({mach['cpu_capability']} kernels of ATen)" if 'cpu_capability' in mach else ''
    lines = [f"- CPU: {mach.get('cpu', '?')}{isa}; {mach.get('cores', '?')} logical cores "
             f"({mach.get('affinity', '?')} usable by this process), "
             f"{mach.get('memory_gib', '?')} GiB memory"]
    if 'gpu' in mach:
        lines.append(f"- GPU: {mach['gpu']} (CUDA {mach.get('cuda', '?')})")
    lines.append(f"- threads: {mach.get('threads', '?')}; device {data['options']['device']}, "
                 f"dtype {data['options']['dtype']}"
                 f"{', torch.compile' if data['options'].get('compile') else ''}"
                 + (f"; mmeffvit's linear layers on "
                    f"{_GEMM_NAMES.get(mach['linear_kernel'], mach['linear_kernel'])}'s GEMM"
                    if 'linear_kernel' in mach else '')
                 + ("; mmeffvit's Triton kernels selected (`MMEFFVIT_TRITON=1`)"
                    if mach.get('triton') else ''))
    lines.append(f"- torch {mach.get('torch', '?')}, mmengine {mach.get('mmengine', '?')}, "
                 f"mmcv {mach.get('mmcv', '?')}, mmdet {mach.get('mmdet', '?')}, "
                 f"Python {mach.get('python', '?')}; mmeffvit compiled ops: "
                 f"{mach.get('mmeffvit_ops', '?')}")
    lines.append(f"- date: {data['date']}; run took {data.get('elapsed_s', 0) / 60:.1f} min; "
                 f"load average (1 min) {mach.get('load_start', '?')} at the start, "
                 f"{mach.get('load_end', '?')} at the end")
    return lines


def _header(data, title, intro):
    lines = [f'# {title}', '', intro, '', 'Command (from the repository root):', '',
             '    ' + data['command'], '']
    lines += _machine_lines(data)
    if data.get('note'):
        lines += ['', f"**Note.** {data['note']}"]
    return lines + ['']


def _method_lines(data):
    opts = data['options']
    isolated = opts['isolate'] == 'measurement'
    batch = opts.get('backbone_batch', 1)  # runs before it had one image
    unit = 'one per backbone, mode, shape and round' if isolated else 'one per backbone and round'
    return [
        '## Method', '',
        f'Every measurement runs in a child process of its own ({unit}), '
        + ('spawned (CUDA)' if opts.get('device') == 'cuda' else
           'forked from a server that imported torch, mmdet and mmeffvit and ran nothing')
        + '; rounds '
        'go round-robin over the backbones, so a change of machine load hits them alike. '
        f"Each child runs {opts['warmup']} untimed warm-up step(s) at the main shape "
        f"({opts['sweep_warmup']} elsewhere) and {opts['reps']} timed one(s); min and median are "
        f"over all rounds. Input: {_images(batch)} `{batch}×3×H×W`, random, the same for every "
        'backbone. *Inference*: eval mode, `torch.no_grad()`. *Training step*: train mode, '
        'forward, sum of all outputs (plus the auxiliary losses a backbone computes in training, '
        'LaViT\'s L_DP), backward; '
        + ('AdamW step (lr 1e-4, weight decay 0.05, as the detection configs)'
           if opts.get('optimizer') == 'adamw' else 'no optimiser')
        + '. Backbones are built with their detection-config arguments '
        '(drop path included), random weights. Memory allocator: as the tools use it '
        '(`mmeffvit/utils/allocator.py`): children that only run inference keep freed memory '
        'for reuse (glibc `mallopt`, as `tools/test.py`), training children keep glibc\'s '
        f"defaults (as `tools/train.py`); `MMEFFVIT_MALLOC` was "
        f"{opts.get('malloc_env') or 'unset'}.", '',
        '*alloc peak*: the most memory torch\'s allocator held during one step, weights and input '
        'included (CPU: profiler memory events of the first warm-up step; CUDA: '
        '`max_memory_allocated`); BLAS/oneDNN scratch buffers are not torch allocations. '
        '*peak RSS*: `ru_maxrss` of the child'
        + ('' if isolated else ' (high-water mark of a child that ran several measurements)')
        + '. *GMACs*: forward multiply-adds counted by mmeffvit\'s complexity module (one MAC = '
        'one multiply-add, the number papers call FLOPs); *GMAC/s* = GMACs / inference min '
        'time, next to the rate of an fp32 `n×n` GEMM measured in the same run with the same '
        'threads, by the fastest kernel this torch has (`torch.mm`, and on CPU also oneDNN\'s '
        'linear kernel, which mmeffvit\'s linear layers run on AVX-512 CPUs). *×peer*: ratio '
        'to the softmax backbone of mmdet that users would otherwise pick (lower is better); '
        'for times the ratio of the two minima and that of the two medians over rounds.', '']


def backbone_tables(data):
    """Markdown lines: main-shape tables (speed, memory) and the resolution sweep."""
    stats = summarise(data['measurements'])
    cases = data['cases']
    peers = {c['name']: c.get('peer') for c in cases}
    main = tuple(data['main_shape'])
    macs = data.get('macs', {})
    gemm = gemm_rate(data.get('gemm', {}).get('float32', []))
    lines = [f'## {shape_label(main)}', '']
    if gemm:
        lines += [_gemm_line('fp32 GEMM', gemm), '']
    for dtype, runs in data.get('gemm', {}).items():
        rate = gemm_rate(runs)
        if dtype != 'float32' and rate:
            lines += [_gemm_line(f'{dtype} GEMM', rate), '']

    def get(name, mode, field, shape=main):
        return stats.get((name, shape, mode), {}).get(field)

    def speed_ratios(name, peer, mode):
        # the min picks each side's best round, the median its typical one (rounds interleave)
        if not peer:
            return '–'
        return ' / '.join(_ratio(get(name, mode, f), get(peer, mode, f))
                          for f in ('min', 'median'))

    rows = []
    for c in cases:
        name, peer = c['name'], peers[c['name']]
        gmacs = macs.get(name, {}).get('macs')
        gmacs = gmacs / 1e9 if gmacs else None
        t_inf, t_train = get(name, 'infer', 'min'), get(name, 'train', 'min')
        rate = gmacs / t_inf if gmacs and t_inf else None
        params = get(name, 'infer', 'params') or get(name, 'train', 'params')
        rows.append([
            name + (' (softmax)' if c.get('softmax') else ''), peer or '–',
            _fmt(params, 2, 1e6), _fmt(gmacs, 1),
            f"{_fmt(t_inf, 3)} / {_fmt(get(name, 'infer', 'median'), 3)}",
            f"{_fmt(t_train, 3)} / {_fmt(get(name, 'train', 'median'), 3)}",
            _fmt(rate, 1), f'{100 * rate / gemm["best"]:.0f} %' if rate and gemm else '–',
            speed_ratios(name, peer, 'infer'), speed_ratios(name, peer, 'train')])
    lines += ['### Speed', '']
    lines += _md_table(['backbone', 'peer', 'params M', 'GMACs', 'inference s min / median',
                        'train step s min / median', 'GMAC/s', '% of GEMM',
                        'inference ×peer min / median', 'train ×peer min / median'], rows,
                       ['---', '---'] + ['--:'] * 8)
    spread = []
    for c in cases:
        name, peer = c['name'], peers[c['name']]
        if not peer:
            continue
        cells, rounds = [], 0
        for mode in ('infer', 'train'):
            r = round_ratios(data['measurements'], name, peer, main, mode)
            cells.append(f'{r[0]:.2f}–{r[-1]:.2f} ({statistics.median(r):.2f})' if r else '–')
            rounds = max(rounds, len(r))
        spread.append([name, peer, str(rounds)] + cells)
    if any(int(row[2]) > 1 for row in spread):
        lines += ['', '### Ratio per round', '',
                  'The ratio to the peer within each round (interleaved, so both saw the same '
                  'load): lowest–highest (median). Its spread is what this machine resolves.',
                  '']
        lines += _md_table(['backbone', 'peer', 'rounds', 'inference ×peer per round',
                            'train ×peer per round'], spread, ['---', '---', '--:', '--:', '--:'])
    rows = []
    for c in cases:
        name, peer = c['name'], peers[c['name']]
        a_inf, a_tr = get(name, 'infer', 'alloc_peak'), get(name, 'train', 'alloc_peak')
        r_inf, r_tr = get(name, 'infer', 'rss_peak'), get(name, 'train', 'rss_peak')
        rows.append([name, _fmt(a_inf, 0, MIB), _fmt(r_inf, 0, MIB), _fmt(a_tr, 0, MIB),
                     _fmt(r_tr, 0, MIB),
                     _ratio(a_tr, get(peer, 'train', 'alloc_peak')) if peer else '–',
                     _ratio(r_tr, get(peer, 'train', 'rss_peak')) if peer else '–'])
    lines += ['', '### Memory (MiB)', '']
    lines += _md_table(['backbone', 'inference alloc peak', 'inference peak RSS',
                        'train alloc peak', 'train peak RSS', 'train alloc ×peer',
                        'train RSS ×peer'], rows)
    lines += [''] + sweep_tables(data, stats)
    lines += error_lines(data, stats)
    return lines


def sweep_fits(data, stats=None):
    """``{case: {quantity: exponent}}`` over the sweep shapes (see :func:`fit_exponent`)."""
    stats = stats or summarise(data['measurements'])
    shapes = [tuple(s) for s in data['shapes']]
    pixels = [h * w for h, w in shapes]
    quantities = dict(infer_time=('infer', 'min'), train_time=('train', 'min'),
                      train_alloc=('train', 'alloc_peak'), train_rss=('train', 'rss_peak'))
    fits = {}
    for c in data['cases']:
        fits[c['name']] = {
            q: fit_exponent(pixels, [stats.get((c['name'], s, mode), {}).get(field)
                                     for s in shapes])
            for q, (mode, field) in quantities.items()}
        # the weights (fp32: 4 B each) are a constant part of the peak; a model with many
        # parameters grows more slowly in total for the same activation memory
        beyond = []
        for s in shapes:
            st = stats.get((c['name'], s, 'train'), {})
            alloc, params = st.get('alloc_peak'), st.get('params')
            beyond.append(None if alloc is None or params is None else alloc - 4 * params)
        fits[c['name']]['train_alloc_beyond_weights'] = fit_exponent(pixels, beyond)
        # MiB per megapixel
        fits[c['name']]['train_alloc_growth'] = fit_growth(
            [p / 1e6 for p in pixels],
            [stats.get((c['name'], s, 'train'), {}).get('alloc_peak') for s in shapes]) / MIB
    return fits


def sweep_tables(data, stats):
    shapes = [tuple(s) for s in data['shapes']]
    if len(shapes) < 2:
        return []
    fits = sweep_fits(data, stats)
    labels = [shape_label(s) for s in shapes]
    lines = ['## Resolution sweep', '',
             'Exponent *b* of a least-squares fit `value ∝ pixels^b` on log-log axes over '
             f"{', '.join(labels)} (1 = linear in the image area, 2 = quadratic). Times are the "
             'min over rounds. *beyond weights*: the allocator peak less the fp32 weights '
             '(4 B × parameters), the part that can grow with the image. *growth*: slope of a '
             'straight-line fit `alloc = a + s·pixels`, MiB per megapixel: what each pixel adds, '
             'whatever the constant part.', '']
    peers = {c['name']: c.get('peer') for c in data['cases']}
    rows = []
    for c in data['cases']:
        name, peer = c['name'], peers[c['name']]
        cells = [_fmt(stats.get((name, s, 'train'), {}).get('min'), 2) for s in shapes]
        cells += [_fmt(stats.get((name, s, 'train'), {}).get('alloc_peak'), 0, MIB)
                  for s in shapes]
        f = fits[name]
        cells += [_fmt(f['infer_time']), _fmt(f['train_time']), _fmt(f['train_alloc']),
                  _fmt(f['train_alloc_beyond_weights']), _fmt(f['train_rss']),
                  _fmt(f['train_alloc_growth'], 0),
                  _ratio(f['train_alloc_growth'], fits[peer]['train_alloc_growth'])
                  if peer in fits else '–']
        rows.append([name] + cells)
    header = (['backbone'] + [f'train s {lb}' for lb in labels]
              + [f'train alloc MiB {lb}' for lb in labels]
              + ['b inference time', 'b train time', 'b train alloc',
                 'b train alloc beyond weights', 'b train RSS', 'train alloc growth MiB/Mpx',
                 'growth ×peer'])
    lines += _md_table(header, rows)
    rows = []
    for c in data['cases']:
        rows.append([c['name']] + [
            _fmt(stats.get((c['name'], s, 'infer'), {}).get('min'), 3) for s in shapes] + [
            _fmt(stats.get((c['name'], s, 'train'), {}).get('rss_peak'), 0, MIB)
            for s in shapes])
    lines += ['']
    lines += _md_table(['backbone'] + [f'inference s {lb}' for lb in labels]
                       + [f'train peak RSS MiB {lb}' for lb in labels], rows)
    return lines + ['']


def error_lines(data, stats):
    errors = [(k, s['errors']) for k, s in sorted(stats.items()) if s['errors']]
    unsupported = {k: v['unsupported_ops'] for k, v in data.get('macs', {}).items()
                   if v.get('unsupported_ops')}
    macs_errors = {k: v['error'] for k, v in data.get('macs', {}).items() if 'error' in v}
    if not (errors or unsupported or macs_errors):
        return []
    lines = ['## Failures and caveats', '']
    for (name, shape, mode), errs in errors:
        lines.append(f'- {name} {shape_label(shape)} {mode}: ' + '; '.join(errs))
    for name, err in macs_errors.items():
        lines.append(f'- {name}: MACs not counted ({err})')
    for name, ops in unsupported.items():
        lines.append(f'- {name}: operators the MAC counter does not know (not counted): '
                     + ', '.join(f'{op} ×{n}' for op, n in sorted(ops.items())))
    return lines + ['']


def detector_tables(data):
    stats = summarise(data['measurements'])
    batch = data['options']['batch']
    rows = []
    for c in data['cases']:
        name, shape = c['name'], tuple(data['main_shape'])
        cells = [name, _fmt((stats.get((name, shape, 'test'), {}) or
                             stats.get((name, shape, 'train'), {})).get('params'), 2, 1e6)]
        for mode in ('test', 'train'):
            s = stats.get((name, shape, mode), {})
            best = batch / s['min'] if s.get('min') else None
            med = batch / s['median'] if s.get('median') else None
            cells += [f'{_fmt(best, 2)} / {_fmt(med, 2)}', _fmt(s.get('alloc_peak'), 0, MIB),
                      _fmt(s.get('rss_peak'), 0, MIB)]
        rows.append(cells)
    lines = [f"## {shape_label(data['main_shape'])}, batch {batch}", '']
    lines += _md_table(['config', 'params M', 'test_step img/s best / median',
                        'test alloc peak MiB', 'test peak RSS MiB',
                        'train_step img/s best / median', 'train alloc peak MiB',
                        'train peak RSS MiB'], rows)
    return lines + [''] + error_lines(data, stats)


def render_markdown(data, plot_files=()):
    if data['options'].get('configs'):
        opts = data['options']
        lines = _header(data, 'Detector / segmentor benchmark',
                        'Images per second of whole models built from their configs (with '
                        'mmeffvit registered), measured in one run by '
                        '`tools/analysis/benchmark.py --config`.')
        lines += [
            '## Method', '',
            '`model.test_step` (eval, no grad, post-processing included) and '
            '`model.train_step` (losses, backward, one update by the optim_wrapper of the '
            'config) on one synthetic batch of shapes images (mmeffvit.datasets.shapes, resized '
            'to the input size) with their boxes and masks or label maps. Random weights: a '
            'detector keeps up to its `max_per_img` boxes, so test-time post-processing is at '
            'its most expensive. SyncBN is reverted to BatchNorm (one process). Each '
            f"measurement runs in a child process of its own, {opts['warmup']} warm-up and "
            f"{opts['reps']} timed step(s) per child, {opts['rounds']} round(s) interleaved "
            'over the configs; img/s = batch / seconds (best = min time). Memory as in the '
            'backbone report (allocator peak from profiler memory events on CPU, '
            '`max_memory_allocated` on CUDA; peak RSS of the child).', '']
        return '\n'.join(lines + detector_tables(data)) + '\n'
    lines = _header(data, 'Backbone benchmark: mmeffvit vs the softmax backbones of mmdet',
                    'What each mmeffvit family costs next to the softmax backbone a user of '
                    'mmdet would otherwise pick, on the same input and threads, measured in one '
                    'run by `tools/analysis/benchmark.py`.')
    lines += _method_lines(data) + backbone_tables(data)
    for path in plot_files:
        lines += [f'![{osp.splitext(osp.basename(path))[0]}]({path})', '']
    return '\n'.join(lines) + '\n'


_TICK_MERGE_RATIO = 1.15


def _merged_ticks(pixels, labels, ratio=_TICK_MERGE_RATIO):
    """``(position, label)`` x ticks in pixel order; sizes within ``ratio`` of each other
    (1024² and 800×1333 differ by 2 %) share one tick with their labels stacked."""
    groups = []
    for p, label in sorted(zip(pixels, labels)):
        if groups and p <= groups[-1][0][-1] * ratio:
            groups[-1][0].append(p)
            groups[-1][1].append(label)
        else:
            groups.append(([p], [label]))
    return [(math.prod(ps) ** (1 / len(ps)), '\n'.join(ls)) for ps, ls in groups]


def off_line_shapes(shapes, main):
    """Sizes of the sweep drawn as hollow markers off the lines: those sharing a tick with the
    main shape (1024² beside 800×1333, 2 % apart). Joined, a line would zigzag between the
    main shape's min over all rounds and that size's fewer rounds."""
    if not main:
        return set()
    main_pix = main[0] * main[1]
    return {tuple(s) for s in shapes if tuple(s) != tuple(main) and max(
        s[0] * s[1], main_pix) <= min(s[0] * s[1], main_pix) * _TICK_MERGE_RATIO}


def plot_sweep(data, plot_dir, rel_to):
    """``latency.png`` and ``memory.png`` in ``plot_dir``; returns paths relative to ``rel_to``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    stats = summarise(data['measurements'])
    shapes = sorted((tuple(s) for s in data['shapes']), key=lambda s: s[0] * s[1])
    mpix = [h * w / 1e6 for h, w in shapes]
    fits = sweep_fits(data, stats)
    main = tuple(data.get('main_shape') or ())
    off_line = off_line_shapes(shapes, main)
    # mmeffvit cases: distinct colours, solid; softmax peers: greys, dashed, square markers
    colours, n_own, n_peer = {}, 0, 0
    for c in data['cases']:
        if c.get('softmax'):
            colours[c['name']] = str(0.1 + 0.15 * (n_peer % 5))
            n_peer += 1
        else:
            colours[c['name']] = plt.get_cmap('tab10')(n_own % 10)
            n_own += 1
    figures = dict(
        latency=[('inference', 'infer', 'min', 1.0, 'seconds', 'infer_time'),
                 ('training step', 'train', 'min', 1.0, 'seconds', 'train_time')],
        memory=[('training step: allocator peak', 'train', 'alloc_peak', MIB, 'MiB',
                 'train_alloc'),
                ('training step: peak RSS', 'train', 'rss_peak', MIB, 'MiB', 'train_rss')])
    paths = []
    for fig_name, panels in figures.items():
        fig, axes = plt.subplots(1, len(panels), figsize=(15, 6.5))
        for ax, (title, mode, field, scale, unit, fit_key) in zip(axes, panels):
            for c in data['cases']:
                pts = [(p, stats.get((c['name'], s, mode), {}).get(field), s in off_line)
                       for p, s in zip(mpix, shapes)]
                pts = sorted((p, v / scale, off) for p, v, off in pts if v)  # in pixel order
                line = [(p, v) for p, v, off in pts if not off]
                hollow = [(p, v) for p, v, off in pts if off]
                if not line:
                    continue
                b = fits[c['name']][fit_key]
                marker = 's' if c.get('softmax') else 'o'
                ax.plot(*zip(*line), color=colours[c['name']], linestyle='--' if c.get('softmax')
                        else '-', marker=marker, markersize=4, linewidth=1.6,
                        label=f"{c['name']} (b={b:.2f})" if math.isfinite(b) else c['name'])
                if hollow:
                    ax.plot(*zip(*hollow), linestyle='none', marker=marker, markersize=5,
                            markerfacecolor='none', color=colours[c['name']])
            ax.set_xscale('log')
            ax.set_yscale('log')
            ticks = _merged_ticks(mpix, [shape_label(s) for s in shapes])
            ax.set_xticks([t for t, _ in ticks])
            ax.set_xticklabels([label for _, label in ticks])
            ax.minorticks_off()
            ax.set_xlabel('input (log pixels)')
            ax.set_ylabel(f'{unit} (log)')
            ax.set_title(title)
            ax.grid(True, which='major', alpha=0.3)
            if ax.lines:
                sizes = ', '.join(shape_label(s) for s in sorted(off_line))
                ax.legend(loc='upper left', fontsize=7, title_fontsize=7,
                          title='dashed: softmax (mmdet); b: fitted exponent'
                          + (f'\nhollow: {sizes} (off the line, next to '
                             f'{shape_label(main)})' if off_line else ''))
        opts = data['options']
        fig.suptitle(f"{fig_name} vs input size, batch {opts.get('backbone_batch', 1)}, "
                     f"{opts['device']} {opts['dtype']}, "
                     f"{data['machine'].get('threads', '?')} threads")
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        path = osp.join(plot_dir, f'{fig_name}.png')
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(osp.relpath(path, rel_to))
    return paths
