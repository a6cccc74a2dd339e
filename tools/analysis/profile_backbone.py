"""Where the time of a backbone goes: ``torch.profiler`` on one inference and one training step.

For every case of ``tools/analysis/benchmark.py`` (by default each mmeffvit family plus mmdet's
PVT-T and Swin-T as references), in a child process per case and mode: one warm-up step, then
one step under the profiler (input shapes and Python frames recorded). The report lists per
backbone the top operators by self CPU time with their share of the total, host syncs
(``aten::item`` / ``is_nonzero`` / ``_local_scalar_dense``), copies (``copy_``, ``contiguous``,
``cat``, ``roll``, ``unfold``, ``gather`` ...), the GEMM kernels (calls, share, size per call)
and the time charged to the Python functions that issued the operators.

The measured part of the report is written between the markers ``<!-- profiles:start -->`` and
``<!-- profiles:end -->``; text outside them (the diagnosis) is kept when it is regenerated.

    python tools/analysis/profile_backbone.py                    # docs/logs/profiles.md (minutes)
    python tools/analysis/profile_backbone.py --cases LaViT-T --shape 512 --out /tmp/p.md
    python tools/analysis/profile_backbone.py --modes train --memory   # + memory at the peak
    python tools/analysis/profile_backbone.py --from-json docs/logs/profiles/profiles.json
"""
import argparse
import datetime
import json
import os
import os.path as osp
import re
import sys

TOOL_DIR = osp.dirname(osp.abspath(__file__))
if TOOL_DIR not in sys.path:
    sys.path.insert(0, TOOL_DIR)

import benchmark  # noqa: E402

START, END = '<!-- profiles:start -->', '<!-- profiles:end -->'
DEFAULT_CASES = [n for n, (scope, _, _) in benchmark.CASES.items() if scope == 'mmeffvit'] + [
    'PVT-T', 'Swin-T']


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--cases', default=','.join(DEFAULT_CASES))
    p.add_argument('--shape', type=benchmark.parse_shape, default=(800, 1333))
    p.add_argument('--modes', default='infer,train')
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--top', type=int, default=10, help='operators per table')
    p.add_argument('--memory', action='store_true',
                   help='also record allocations: what is live at the peak, by allocating code')
    p.add_argument('--timeout', type=float, default=3600.)
    p.add_argument('--out', default=osp.join(benchmark.REPO_ROOT, 'docs', 'logs', 'profiles.md'))
    p.add_argument('--json', help='raw results (default: <out without .md>/profiles.json)')
    p.add_argument('--from-json', help='render an earlier run, profile nothing')
    args = p.parse_args(argv)
    args.case_names = benchmark.select_cases(args.cases, with_peers=False)
    args.modes = [m for m in args.modes.split(',') if m]
    if not args.modes or any(m not in ('infer', 'train') for m in args.modes):
        p.error('--modes: infer, train or both')
    args.json = args.json or osp.join(osp.splitext(args.out)[0], 'profiles.json')
    return args


def run(args, argv):
    opts = dict(device='cpu', dtype='float32', threads=args.threads)
    runner = benchmark.Runner(opts, args.timeout,
                              ['torch', 'numpy', 'mmeffvit', 'mmdet.models',
                               'mmeffvit.analysis.benchmark_worker'])
    jobs = [dict(kind='profile', name=n, shape=tuple(args.shape), mode=m, memory=args.memory,
                 case=dict(scope=benchmark.CASES[n][0], cfg=benchmark.CASES[n][1]))
            for n in args.case_names for m in args.modes]
    progress = benchmark.Progress([[j] for j in jobs])
    started = datetime.datetime.now().astimezone().isoformat(timespec='seconds')
    host = benchmark.host_info()
    results = {}
    for job in jobs:
        results.setdefault(job['name'], {})[job['mode']] = runner.run([job], progress.update)[0]
    host['load_end'] = round(os.getloadavg()[0], 2)
    return dict(command=benchmark.command_line(argv, __file__), date=started,
                shape=list(args.shape), threads=args.threads, host=host,
                cases=args.case_names, modes=args.modes, results=results)


def _calls(res):
    """Operator calls of a profiled step (older results kept every operator instead)."""
    return res.get('calls', sum(c for _, c, _ in res['ops']))


def _pct(part, total):
    return f'{100 * part / total:.1f} %' if total else '–'


def _short(name):
    """``…/site-packages/mmdet/models/x.py(12): f`` → ``mmdet/models/x.py(12): f``."""
    return re.sub(r'^.*?(?=(mmeffvit|mmdet|mmcv|timm)/)', '', name)


def render_case(name, modes, top):
    lines = [f'#### {name}', '']
    for mode, res in modes.items():
        label = 'inference' if mode == 'infer' else 'training step'
        if 'error' in res:
            lines += [f'{label}: failed: {res["error"]}', '']
            continue
        total = res['total_us']
        g = res['gemm']
        copies = sum(us for _, us in res['copies'].values())
        lines += [
            f"**{label}**: {res['warm_s']:.2f} s unprofiled, {res['profiled_s']:.2f} s "
            f"profiled, {_calls(res)} operator calls.", '',
            '| operator | calls | self CPU share |', '|---|--:|--:|']
        lines += [f'| `{op}` | {calls} | {_pct(us, total)} |' for op, calls, us in
                  res['ops'][:top]]
        syncs = ', '.join(f'`{n}` ×{c}' for n, c in res['syncs'].items()) or 'none'
        copy_text = ', '.join(f'`{n}` ×{c} ({_pct(us, total)})' for n, (c, us) in
                              sorted(res['copies'].items(), key=lambda kv: -kv[1][1]))
        rate = g['macs'] / (g['us'] / 1e6) / 1e9 if g['us'] else 0
        lines += [
            '', f'- host syncs: {syncs}',
            f'- copies and rearrangements, {_pct(copies, total)} in all: {copy_text or "none"}',
            f"- GEMM kernels (`mm`/`addmm`/`bmm`/`baddbmm`/`mkldnn::_linear_pointwise`): "
            f"{g['calls']} calls, "
            f"{_pct(g['us'], total)} of the time, {g['macs'] / 1e9:.1f} GMACs at "
            f"{rate:.0f} GMAC/s inside them; median {g['median_macs'] / 1e6:.2f} MMACs per "
            f"call, {g['small_calls']} calls under 1 MMAC"]
        owners = [(f, us) for f, us in res['owners'] if us / total >= 0.01][:8]
        if owners:
            charged = '; '.join(f'`{_short(f)}` {_pct(us, total)}' for f, us in owners)
            lines.append('- time of top-level operators by the Python function that issued '
                         'them: ' + charged)
        if res.get('backward'):
            lines.append('- backward nodes: ' + '; '.join(
                f'`{n}` {_pct(us, total)}' for n, us in res['backward'][:6]))
        mem = res.get('memory')
        if mem:
            held = '; '.join(f'`{_short(o)}` {b / 2**20:.0f}' for o, b in mem['owners'][:8])
            lines.append(f"- memory: torch allocations peak at {mem['peak'] / 2**20:.0f} MiB "
                         f"above the {mem['static'] / 2**20:.0f} MiB of weights and input; "
                         f'live at the peak, MiB by allocating code [operator]: {held}')
        lines.append('')
    return lines


def summary_table(data):
    rows = ['| backbone | mode | top operator | GEMM share | copies share | host syncs | '
            'operator calls |', '|---|---|---|--:|--:|--:|--:|']
    for name in data['cases']:
        for mode, res in data['results'].get(name, {}).items():
            if 'error' in res:
                rows.append(f'| {name} | {mode} | failed | | | | |')
                continue
            total = res['total_us']
            op, _, us = res['ops'][0]
            copies = sum(u for _, u in res['copies'].values())
            syncs = res['syncs'].get('aten::_local_scalar_dense', 0) or max(
                res['syncs'].values(), default=0)
            rows.append(f"| {name} | {mode} | `{op}` {_pct(us, total)} | "
                        f"{_pct(res['gemm']['us'], total)} | {_pct(copies, total)} | {syncs} | "
                        f"{_calls(res)} |")
    return rows


def render(data, top):
    h, w = data['shape']
    host = data['host']
    load = (f"load average {host.get('load_start', '?')} at the start, {host['load_end']} at "
            'the end' if 'load_end' in host else f"load average {host.get('load_start', '?')}")
    lines = [START, '', f"Measured {data['date']} on {host.get('cpu', '?')} "
             f"({host.get('cores', '?')} cores, {load}), {data['threads']} thread(s), input "
             f'1×3×{h}×{w}, fp32, with:', '',
             '    ' + data['command'], '',
             'Shares are of the summed self CPU time of all operators in the profiled step. '
             'Host syncs count `_local_scalar_dense`, the call under every `item` / '
             '`is_nonzero`.', '', '### Summary', '']
    lines += summary_table(data) + ['', '### Per backbone', '']
    for name in data['cases']:
        lines += render_case(name, data['results'].get(name, {}), top)
    return lines + [END]


def write_section(out, generated, start, end, fresh):
    """``generated`` (from ``start`` to ``end``) in place of that section of ``out``, text
    around it kept; ``fresh(text)`` gives the file where the section is not there yet."""
    text = ''
    if osp.exists(out):
        with open(out, encoding='utf-8') as f:
            text = f.read()
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + generated + rest.split(end, 1)[1]
    else:
        text = fresh(text)
    with open(out, 'w', encoding='utf-8') as f:
        f.write(text)


def write(data, out, top):
    generated = '\n'.join(render(data, top))
    write_section(out, generated, START, END,
                  lambda _: '# Profiles of the backbones\n\n' + generated + '\n')


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json, encoding='utf-8') as f:
            data = json.load(f)
    else:
        data = run(args, argv)
        os.makedirs(osp.dirname(args.json), exist_ok=True)
        with open(args.json, 'w', encoding='utf-8') as f:
            json.dump(data, f, indent=1)
    write(data, args.out, args.top)
    print(f'wrote {args.out}', file=sys.stderr)


if __name__ == '__main__':
    main()
