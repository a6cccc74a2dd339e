"""Benchmark mmeffvit's backbones side by side with the softmax backbones of mmdet, in one run.

What a user runs to choose a backbone. For every case (the smallest detection variant of each
mmeffvit family, and mmdet's PVT-T, PVTv2-B0/B1 and Swin-T as softmax peers, all built from
their registries with the arguments of their detection configs):

* inference (eval, no grad) and one training step (train mode, forward, backward of the summed
  outputs) on one ``1×3×H×W`` image: min and median seconds over rounds;
* peak memory: torch's allocator peak and the peak RSS of the process (CUDA:
  ``max_memory_allocated``); parameters; forward GMACs (mmeffvit's complexity counting) and the
  achieved GMAC/s next to an fp32 GEMM measured in the same run with the same threads;
* ratios to each case's softmax peer;
* a resolution sweep (512², 800×1333, 1024², 1536²) with the fitted exponent of time and memory
  against pixels, and plots of both (``docs/benchmarks/*.png``).

Each measurement runs in a child process of its own (so memory peaks are separate), forked from a
server that imported torch, mmdet and mmeffvit once; rounds are interleaved over the cases
(round-robin). One line per finished measurement, with an ETA, goes to stderr. The report goes to
``docs/benchmarks.md``, the raw numbers to ``docs/benchmarks/results.json``.

With ``--config`` the same machinery times whole detectors / segmentors: images/s of
``model.test_step`` and ``model.train_step`` on a synthetic batch of shapes images.

Examples::

    python tools/analysis/benchmark.py                        # everything, CPU (long)
    python tools/analysis/benchmark.py --cases FLatten-Swin-T --sweep none --rounds 2
    python tools/analysis/benchmark.py --quick --cases FLatten-PVTv2-B0 --out /tmp/b.md
    python tools/analysis/benchmark.py --device cuda --dtype bf16 [--compile]
    python tools/analysis/benchmark.py --config configs/mask_rcnn_flatten_pvt_t_1x.py \\
        --shape 800x1333 --batch 2 --out /tmp/detectors.md
    python tools/analysis/benchmark.py --from-json docs/benchmarks/results.json  # re-render
"""
import argparse
import datetime
import difflib
import json
import multiprocessing as mp
import os
import os.path as osp
import shlex
import sys
import time

TOOL_DIR = osp.dirname(osp.abspath(__file__))
REPO_ROOT = osp.dirname(osp.dirname(TOOL_DIR))
for _path in (TOOL_DIR, REPO_ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from mmeffvit.analysis import benchmark_report as report  # noqa: E402
from mmeffvit.ops.policy import policy  # noqa: E402


def malloc_setting():
    """``MMEFFVIT_MALLOC`` as the report shows it (empty when unset)."""
    return '' if policy().malloc == 'default' else policy().malloc


# name: (scope, backbone config, softmax peer); the arguments are those of the detection config
# named in the comment (init_cfg left out: random weights)
_SWIN_T = dict(type='SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
               num_heads=[3, 6, 12, 24], window_size=7, mlp_ratio=4, qkv_bias=True,
               drop_path_rate=0.2, patch_norm=True, out_indices=(0, 1, 2, 3))
CASES = {
    # mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py
    'PVT-T': ('mmdet', dict(type='PyramidVisionTransformer', num_layers=[2, 2, 2, 2]), None),
    # configs/mask_rcnn_flatten_pvt_t_1x.py
    'FLatten-PVT-T': ('mmeffvit', dict(type='FLattenPVT', arch='tiny', drop_path_rate=0.1),
                      'PVT-T'),
    # configs/retinanet_lavit_t_1x.py
    'LaViT-T': ('mmeffvit', dict(type='LaViT', arch='tiny', la_mode='window', drop_path_rate=0.1,
                                 diag_loss=dict(type='DiagonalityLoss', loss_weight=0.01)),
                'PVT-T'),
    # mmdet::pvt/retinanet_pvtv2-b0_fpn_1x_coco.py and -b1
    'PVTv2-B0': ('mmdet', dict(type='PyramidVisionTransformerV2', embed_dims=32,
                               num_layers=[2, 2, 2, 2]), None),
    'FLatten-PVTv2-B0': ('mmeffvit', dict(type='FLattenPVTv2', arch='b0', drop_path_rate=0.1),
                         'PVTv2-B0'),
    'PVTv2-B1': ('mmdet', dict(type='PyramidVisionTransformerV2', embed_dims=64,
                               num_layers=[2, 2, 2, 2]), None),
    'FLatten-PVTv2-B1': ('mmeffvit', dict(type='FLattenPVTv2', arch='b1', drop_path_rate=0.1),
                         'PVTv2-B1'),
    # mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py
    'Swin-T': ('mmdet', _SWIN_T, None),
    # configs/mask_rcnn_flatten_swin_t_1x.py, ..._cswin_t_1x, ..._focal_t_1x, ..._l2vit_t_1x,
    # ..._care_s0_1x
    'FLatten-Swin-T': ('mmeffvit', dict(type='FLattenSwin', arch='tiny', attn_type='LLSS',
                                        window_size=7, drop_path_rate=0.2), 'Swin-T'),
    'FLatten-CSWin-T': ('mmeffvit', dict(type='FLattenCSWin', arch='tiny', attn_types='LLSS',
                                         drop_path_rate=0.2), 'Swin-T'),
    'Focal-T': ('mmeffvit', dict(type='FocalTransformer', arch='tiny', use_conv_embed=False,
                                 mask_borders=True, drop_path_rate=0.2), 'Swin-T'),
    'L2ViT-T': ('mmeffvit', dict(type='L2ViT', arch='tiny', drop_path_rate=0.1), 'Swin-T'),
    'CARE-S0': ('mmeffvit', dict(type='CARE', arch='s0', last_block='expanded',
                                 drop_path_rate=0.1), 'Swin-T'),
}
DEFAULT_SHAPE = (800, 1333)
DEFAULT_SWEEP = ((512, 512), (800, 1333), (1024, 1024), (1536, 1536))
QUICK = dict(shape=(128, 192), sweep=((64, 64), (128, 192), (192, 256)), rounds=1,
             sweep_rounds=1, warmup=0, sweep_warmup=0, reps=1, gemm_size=256, gemm_reps=3)
DTYPES = {'fp32': 'float32', 'float32': 'float32', 'bf16': 'bfloat16', 'bfloat16': 'bfloat16',
          'fp16': 'float16', 'float16': 'float16'}


def parse_shape(text):
    """``'800x1333'`` (H×W) or ``'512'`` (square) → ``(h, w)``."""
    parts = text.lower().replace('×', 'x').split('x')
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) == 1:
        dims = dims * 2
    if len(dims) != 2 or min(dims) < 32:
        raise argparse.ArgumentTypeError(f'shape {text!r}: expected HxW or S, each >= 32')
    return dims


def select_cases(text, with_peers=True):
    """Case names from ``'all'`` or a comma-separated list (case-insensitive), peers added."""
    if text in (None, 'all'):
        return list(CASES)
    by_lower = {name.lower(): name for name in CASES}
    chosen = []
    for item in (t.strip() for t in text.split(',') if t.strip()):
        name = by_lower.get(item.lower())
        if name is None:
            close = difflib.get_close_matches(item, list(CASES), n=3, cutoff=0.3)
            raise SystemExit(f'unknown case {item!r}; '
                             + (f'did you mean {", ".join(close)}? ' if close else '')
                             + f'choose from: {", ".join(CASES)}')
        chosen.append(name)
    if with_peers:
        chosen += [CASES[n][2] for n in chosen if CASES[n][2]]
    return [n for n in CASES if n in chosen]  # table order, duplicates removed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog='\n'.join(__doc__.split('\n')[1:]))
    p.add_argument('--cases', default='all', help=f'comma-separated, from: {", ".join(CASES)}')
    p.add_argument('--no-peers', action='store_true', help='do not add the softmax peers')
    p.add_argument('--config', nargs='+', help='detector / segmentor mode: config file(s)')
    p.add_argument('--batch', type=int, help='images per step (default 1, --config mode 2)')
    p.add_argument('--shape', type=parse_shape, help='main input HxW (default 800x1333)')
    p.add_argument('--sweep', nargs='+', help="input sizes of the sweep, or 'none' "
                   '(default 512 800x1333 1024 1536; the main shape is always included)')
    p.add_argument('--modes', default='infer,train',
                   help="comma-separated: infer, train ('both' = infer,train)")
    p.add_argument('--rounds', type=int, help='rounds at the main shape (default 3)')
    p.add_argument('--sweep-rounds', type=int, help='rounds at the other sizes (default 1)')
    p.add_argument('--warmup', type=int, help='untimed steps per child, main shape (default 1)')
    p.add_argument('--sweep-warmup', type=int, help='same at the other sizes (default --warmup)')
    p.add_argument('--reps', type=int, help='timed steps per child (default 1)')
    p.add_argument('--threads', type=int, help='torch threads (default: usable cores)')
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    p.add_argument('--dtype', default='fp32', choices=sorted(DTYPES),
                   help='autocast dtype (fp32: none)')
    p.add_argument('--compile', action='store_true', help='torch.compile the backbone')
    p.add_argument('--optimizer', choices=['none', 'adamw'], default='none',
                   help="training steps end with the detection configs' AdamW step (adamw)")
    p.add_argument('--isolate', choices=['measurement', 'case'],
                   help='one child per measurement (default on CPU: separate RSS peaks) or per '
                   'case and round (default on CUDA: peaks from max_memory_allocated)')
    p.add_argument('--gemm-size', type=int, help='n of the n×n GEMM (default 2048, CUDA 8192)')
    p.add_argument('--gemm-reps', type=int, help='GEMM repetitions per round (default 5)')
    p.add_argument('--no-macs', action='store_true', help='skip counting GMACs')
    p.add_argument('--mem-limit-gib', type=float,
                   help='address-space limit of each child (RLIMIT_AS): a step that needs more '
                   'fails with an error in the table instead of pushing a shared machine into '
                   'the OOM killer')
    p.add_argument('--timeout', type=float, default=3600., help='seconds per child')
    p.add_argument('--quick', action='store_true',
                   help='tiny sizes, 1 round, no warm-up (a smoke test of the whole tool)')
    p.add_argument('--out', help='markdown report (default docs/benchmarks.md, with --config '
                   'docs/benchmarks_detectors.md)')
    p.add_argument('--plot-dir', help='PNG plots and results.json (default: the report path '
                   'without .md)')
    p.add_argument('--from-json', help='render the report of an earlier run, measure nothing')
    p.add_argument('--note', help='a remark printed under the machine description (e.g. that '
                   'the machine was shared); with --from-json it replaces the stored one')
    args = p.parse_args(argv)
    args.dtype = DTYPES[args.dtype]
    if args.batch is None:
        args.batch = 2 if args.config else 1
    if args.batch < 1:
        p.error('--batch must be >= 1')
    quick = QUICK if args.quick else {}
    args.shape = args.shape or quick.get('shape', DEFAULT_SHAPE)
    if args.sweep is None:
        sweep = list(quick.get('sweep', DEFAULT_SWEEP))
    elif [s.lower() for s in args.sweep] == ['none']:
        sweep = []
    else:
        sweep = [parse_shape(s) for s in args.sweep]
    if args.config:
        sweep = []
    args.shapes = sorted(set(sweep) | {args.shape}, key=lambda s: (s[0] * s[1], s))
    for key, default in (('rounds', 3), ('sweep_rounds', 1), ('warmup', 1), ('reps', 1),
                         ('gemm_reps', 5)):
        if getattr(args, key) is None:
            setattr(args, key, quick.get(key, default))
    if args.sweep_warmup is None:
        args.sweep_warmup = quick.get('sweep_warmup', args.warmup)
    if args.gemm_size is None:
        args.gemm_size = quick.get('gemm_size', 8192 if args.device == 'cuda' else 2048)
    args.isolate = args.isolate or ('case' if args.device == 'cuda' else 'measurement')
    args.modes = [m.strip() for m in args.modes.replace('both', 'infer,train').split(',')
                  if m.strip()]
    if args.config:
        args.modes = ['test' if m == 'infer' else m for m in args.modes]
    valid = ('test', 'train') if args.config else ('infer', 'train')
    if not args.modes or any(m not in valid for m in args.modes):
        p.error(f'--modes: expected a comma-separated subset of {valid}')
    if min(args.rounds, args.reps, args.gemm_reps) < 1 or min(args.warmup,
                                                              args.sweep_warmup) < 0:
        p.error('--rounds, --reps and --gemm-reps must be >= 1, warm-ups >= 0')
    if args.config:
        for path in args.config:
            if not osp.isfile(path):
                p.error(f'--config {path!r}: no such file')
    args.out = args.out or osp.join(REPO_ROOT, 'docs', 'benchmarks_detectors.md' if args.config
                                    else 'benchmarks.md')
    args.plot_dir = args.plot_dir or osp.splitext(args.out)[0]
    args.case_names = [] if args.config else select_cases(args.cases, not args.no_peers)
    if args.threads is None:
        args.threads = len(os.sched_getaffinity(0))
    return args


# --- machine ------------------------------------------------------------------------------------

def host_info():
    info = dict(cores=os.cpu_count(), affinity=len(os.sched_getaffinity(0)),
                load_start=round(os.getloadavg()[0], 2))
    try:
        with open('/proc/cpuinfo') as f:
            info['cpu'] = next((line.split(':', 1)[1].strip() for line in f
                                if line.startswith('model name')), '?')
        with open('/proc/meminfo') as f:
            kib = int(next(line.split()[1] for line in f if line.startswith('MemTotal')))
        info['memory_gib'] = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    return info


# --- child processes ----------------------------------------------------------------------------

def _limit_memory(gib):
    import resource
    limit = int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _child_main(conn, jobs, opts):
    """Runs in the child: optional memory limit, then
    :func:`mmeffvit.analysis.benchmark_worker.run_jobs`."""
    if opts.get('mem_limit_gib'):
        _limit_memory(opts['mem_limit_gib'])
    from mmeffvit.analysis import benchmark_worker
    benchmark_worker.run_jobs(conn, jobs, opts)


def _exit_reason(code, timed_out, timeout):
    if timed_out:
        return f'timed out after {timeout:.0f} s'
    if code is not None and code < 0:
        hint = ' (out of memory?)' if -code == 9 else ''
        return f'child killed by signal {-code}{hint}'
    return f'child exited with code {code} before reporting'


class Runner:
    """Starts children from a fork server and collects their results with progress lines."""

    def __init__(self, opts, timeout, preload, start_method='forkserver'):
        # CUDA: spawn, as a fork server whose imports touched CUDA hands its children a CUDA
        # state they cannot re-initialise (seen on an H200 with torch 2.11)
        self.ctx = mp.get_context(start_method)
        if start_method == 'forkserver':
            self.ctx.set_forkserver_preload(preload)
        self.opts, self.timeout = opts, timeout

    def run(self, jobs, on_result):
        recv, send = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=_child_main, args=(send, jobs, self.opts), daemon=True)
        proc.start()
        send.close()
        results, timed_out = [None] * len(jobs), False
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                proc.kill()
                break
            if not recv.poll(min(left, 5.0)):
                if not proc.is_alive() and not recv.poll(0):
                    break
                continue
            try:
                kind, index, result = recv.recv()
            except EOFError:
                break
            if kind == 'done':
                break
            results[index] = result
            on_result(jobs[index], result)
        proc.join()
        recv.close()
        for i, result in enumerate(results):
            if result is None:
                results[i] = dict(error=_exit_reason(proc.exitcode, timed_out, self.timeout))
                on_result(jobs[i], results[i])
        return results


# --- schedule -----------------------------------------------------------------------------------

def _pixels(shape):
    return shape[0] * shape[1]


def build_schedule(args):
    """Groups of jobs, one group per child, in the order they run (round-robin over cases)."""
    groups = [[dict(kind='machine')]]
    main = tuple(args.shape)
    units = args.config or args.case_names
    for r in range(max(args.rounds, args.sweep_rounds if len(args.shapes) > 1 else 0)):
        if not args.config:
            groups.append([dict(kind='gemm', n=args.gemm_size, reps=args.gemm_reps,
                                dtype='float32', round=r)])
            if args.dtype != 'float32':
                groups.append([dict(kind='gemm', n=args.gemm_size, reps=args.gemm_reps,
                                    dtype=args.dtype, round=r)])
        per_unit = {u: [] for u in units}
        for shape in args.shapes:
            if r >= (args.rounds if shape == main else args.sweep_rounds):
                continue
            warmup = args.warmup if shape == main else args.sweep_warmup
            for unit in units:
                for mode in args.modes:
                    job = dict(kind='detector' if args.config else 'backbone', name=unit,
                               shape=shape, mode=mode, round=r, warmup=warmup, reps=args.reps)
                    job['batch'] = args.batch
                    if args.config:
                        job['config'] = unit
                    else:
                        scope, cfg, _ = CASES[unit]
                        job['case'] = dict(scope=scope, cfg=cfg)
                    per_unit[unit].append(job)
        if args.isolate == 'case':
            groups += [jobs for jobs in per_unit.values() if jobs]
        else:  # round-robin: one shape at a time over all cases, each job a child
            for shape in args.shapes:
                for unit in units:
                    groups += [[j] for j in per_unit[unit] if tuple(j['shape']) == shape]
    if not args.config and not args.no_macs:
        groups += [[dict(kind='macs', name=n, shape=main, case=dict(scope=CASES[n][0],
                                                                    cfg=CASES[n][1]))]
                   for n in args.case_names]
    return groups


class Progress:
    """One stderr line per finished measurement, with elapsed time and an ETA."""

    def __init__(self, groups, stream=sys.stderr):
        self.jobs = [j for g in groups for j in g]
        self.total, self.done, self.stream = len(self.jobs), 0, stream
        self.start = time.monotonic()
        self.last = self.start
        self.seconds = {}  # (kind, name, shape, mode) -> wall seconds of the last such job

    @staticmethod
    def key(job):
        return (job['kind'], job.get('name'), tuple(job.get('shape', ())), job.get('mode'))

    def estimate(self, job):
        key = self.key(job)
        if key in self.seconds:
            return self.seconds[key]
        same = [(k, s) for k, s in self.seconds.items() if k[0] == key[0] and k[3] == key[3]]
        if not same:
            same = list(self.seconds.items())
        if not same:
            return 0.0
        if job.get('shape'):  # scale by the area for a size not seen yet
            est = [s * _pixels(job['shape']) / _pixels(k[2]) if k[2] else s for k, s in same]
        else:
            est = [s for _, s in same]
        return sum(est) / len(est)

    def update(self, job, result):
        now = time.monotonic()
        self.seconds[self.key(job)] = now - self.last
        self.last = now
        self.done += 1
        remaining = sum(self.estimate(j) for j in self.jobs[self.done:])
        self.stream.write(f'[{self.done:3d}/{self.total}] {describe(job, result)} | '
                          f'{_duration(now - self.start)} elapsed, ETA {_duration(remaining)}\n')
        self.stream.flush()


def _duration(seconds):
    seconds = int(seconds)
    return f'{seconds // 60}m{seconds % 60:02d}s' if seconds >= 60 else f'{seconds}s'


def describe(job, result):
    if 'error' in result:
        what = f"ERROR {result['error']}"
    elif job['kind'] == 'gemm':
        what = ', '.join(f"{k} {result['macs'] / min(t) / 1e9:.1f}"
                         for k, t in result.get('kernel_times', {}).items()) + ' GMAC/s'
    elif job['kind'] == 'macs':
        what = f"{result['macs'] / 1e9:.2f} GMACs"
    elif job['kind'] == 'machine':
        what = f"torch {result['torch']}, {result['threads']} threads"
    elif job['kind'] == 'profile':
        what = f"{result['warm_s']:.2f} s, {result['profiled_s']:.2f} s profiled"
    elif job['kind'] == 'kernels':
        what = f"{result['step_ms']:.1f} ms, {result['launches']} {result['kind']}"
    else:
        what = (f"{min(result['times']):.3f} s, alloc peak {result['alloc_peak'] / 2**20:.0f} "
                f"MiB, peak RSS {result['rss_peak'] / 2**20:.0f} MiB")
    if job['kind'] == 'gemm':
        label = f"GEMM {job['dtype']} n={job['n']}"
    elif job['kind'] == 'machine':
        label = 'machine'
    else:
        label = f"{job['name']} {report.shape_label(job['shape'])} {job.get('mode', 'forward')}"
    rnd = f" r{job['round'] + 1}" if 'round' in job else ''
    return f'{label}{rnd}: {what}'


# --- main ---------------------------------------------------------------------------------------

def command_line(argv, script=__file__):
    """The command that reproduces this run, from the repository root."""
    return shlex.join(['python', osp.relpath(osp.abspath(script), REPO_ROOT)] + list(argv))


def measure(args, argv):
    opts = dict(device=args.device, dtype=args.dtype, compile=args.compile,
                threads=args.threads, mem_limit_gib=args.mem_limit_gib,
                optimizer=args.optimizer)
    preload = ['torch', 'numpy', 'mmeffvit', 'mmdet.models',
               'mmeffvit.analysis.benchmark_worker']
    if args.config:
        preload.append('mmseg.models')
    groups = build_schedule(args)
    progress = Progress(groups)
    runner = Runner(opts, args.timeout, preload,
                    'spawn' if args.device == 'cuda' else 'forkserver')
    data = dict(command=command_line(argv),
                date=datetime.datetime.now().astimezone().isoformat(timespec='seconds'),
                options=dict(device=args.device, dtype=args.dtype, compile=args.compile,
                             threads=args.threads, rounds=args.rounds,
                             sweep_rounds=args.sweep_rounds, warmup=args.warmup,
                             sweep_warmup=args.sweep_warmup, reps=args.reps,
                             isolate=args.isolate, batch=args.batch, configs=args.config,
                             optimizer=args.optimizer,
                             backbone_batch=None if args.config else args.batch,
                             mem_limit_gib=args.mem_limit_gib,
                             malloc_env=malloc_setting()),
                machine=host_info(), main_shape=list(args.shape),
                shapes=[list(s) for s in args.shapes],
                cases=[dict(name=n, scope=CASES[n][0], cfg=CASES[n][1], peer=CASES[n][2],
                            softmax=CASES[n][0] == 'mmdet') for n in args.case_names]
                if not args.config else [dict(name=c) for c in args.config],
                measurements=[], gemm={}, macs={})
    start = time.monotonic()
    for jobs in groups:
        for job, result in zip(jobs, runner.run(jobs, progress.update)):
            if job['kind'] == 'machine':
                data['machine'].update({k: v for k, v in result.items() if k != 'error'})
            elif job['kind'] == 'gemm':
                data['gemm'].setdefault(job['dtype'], []).append(
                    dict(n=job['n'], round=job['round'], result=result))
            elif job['kind'] == 'macs':
                data['macs'][job['name']] = result
            else:
                data['measurements'].append(dict(
                    name=job['name'], shape=list(job['shape']), mode=job['mode'],
                    round=job['round'], result=result))
    data['elapsed_s'] = time.monotonic() - start
    data['machine']['load_end'] = round(os.getloadavg()[0], 2)
    return data


def write_report(data, out, plot_dir):
    os.makedirs(plot_dir, exist_ok=True)
    out_dir = osp.dirname(osp.abspath(out))
    plots = []
    if not data['options'].get('configs') and len(data['shapes']) > 1:
        plots = report.plot_sweep(data, plot_dir, out_dir)
    with open(out, 'w', encoding='utf-8') as f:
        f.write(report.render_markdown(data, plots))
    return plots


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json, encoding='utf-8') as f:
            data = json.load(f)
        if args.note:
            data['note'] = args.note
    else:
        data = measure(args, argv)
        if args.note:
            data['note'] = args.note
        os.makedirs(args.plot_dir, exist_ok=True)
        with open(osp.join(args.plot_dir, 'results.json'), 'w', encoding='utf-8') as f:
            json.dump(data, f, indent=1)
    plots = write_report(data, args.out, args.plot_dir)
    print(report.render_markdown(data, plots))
    print(f'wrote {args.out}' + (f' and {", ".join(plots)}' if plots else ''), file=sys.stderr)


if __name__ == '__main__':
    main()
