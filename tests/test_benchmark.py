"""tools/analysis/benchmark.py: exponent fit, report arithmetic, and one end-to-end quick run."""
import importlib.util
import json
import math
import os
import os.path as osp
import re
import subprocess
import sys

import numpy as np
import pytest

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOL = osp.join(REPO_ROOT, 'tools', 'analysis', 'benchmark.py')


def _load_tool():
    spec = importlib.util.spec_from_file_location('benchmark_tool', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_tool()
report = bench.report


def test_fit_exponent_recovers_power_laws():
    pixels = np.array([512 * 512, 800 * 1333, 1024 * 1024, 1536 * 1536], dtype=float)
    for exponent in (0.5, 1.0, 1.6, 2.0):
        assert report.fit_exponent(pixels, 3e-7 * pixels ** exponent) == pytest.approx(exponent)
    # multiplicative noise of a few percent moves the slope by little
    rng = np.random.default_rng(0)
    noisy = 2e-6 * pixels ** 1.3 * np.exp(rng.normal(0, 0.03, size=pixels.size))
    slope = report.fit_exponent(pixels, noisy)
    x, y = np.log(pixels), np.log(noisy)  # closed-form least squares slope
    expected = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    assert slope == pytest.approx(expected)
    assert abs(slope - 1.3) < 0.1


def test_fit_growth_separates_what_each_pixel_adds_from_the_constant():
    pixels = np.array([0.26, 1.05, 2.36])
    small_constant, large_constant = 100 + 2000 * pixels, 600 + 2000 * pixels
    assert report.fit_growth(pixels, small_constant) == pytest.approx(2000)
    assert report.fit_growth(pixels, large_constant) == pytest.approx(2000)
    # the same growth, yet the exponent of the total favours the larger constant
    assert (report.fit_exponent(pixels, large_constant)
            < report.fit_exponent(pixels, small_constant) - 0.1)
    assert math.isnan(report.fit_growth([1.0, 1.0], [1.0, 2.0]))
    assert math.isnan(report.fit_growth([1.0, 2.0], [1.0, None]))


def test_fit_exponent_undefined_cases():
    assert math.isnan(report.fit_exponent([100, 100], [1.0, 2.0]))   # one distinct size
    assert math.isnan(report.fit_exponent([100, 400], [1.0, None]))  # a failed measurement
    # points with a missing or non-positive value are left out, not fitted as zeros
    assert report.fit_exponent([100, 400, 1600], [1.0, 4.0, 0.0]) == pytest.approx(1.0)


def test_close_sizes_share_one_tick():
    # the default sweep: 1024² (1.049 Mpx) and 800×1333 (1.066 Mpx) would print on each other
    ticks = report._merged_ticks([0.262, 1.066, 1.049, 2.359], ['512²', '800×1333', '1024²',
                                                                '1536²'])
    assert [label for _, label in ticks] == ['512²', '1024²\n800×1333', '1536²']
    assert ticks[1][0] == pytest.approx(math.sqrt(1.049 * 1.066))
    assert [p for p, _ in ticks] == sorted(p for p, _ in ticks)
    assert report._merged_ticks([4.0, 1.0], ['b', 'a']) == [(1.0, 'a'), (4.0, 'b')]
    assert report._merged_ticks([], []) == []


def test_round_ratios_pair_the_rounds_both_measured():
    def m(name, rnd, times, mode='infer', shape=(8, 8)):
        return dict(name=name, round=rnd, mode=mode, shape=list(shape),
                    result=dict(times=times) if times else dict(error='killed'))
    ms = [m('a', 0, [2.0]), m('p', 0, [4.0]), m('a', 1, [3.0, 1.5]), m('p', 1, [2.0]),
          m('a', 2, [1.0]), m('p', 2, None),                       # the peer's round failed
          m('a', 3, [9.0], mode='train'), m('p', 3, [1.0], mode='train'),
          m('a', 4, [9.0], shape=(4, 4)), m('p', 4, [1.0], shape=(4, 4))]
    assert report.round_ratios(ms, 'a', 'p', (8, 8), 'infer') == [0.5, 0.75]
    assert report.round_ratios(ms, 'a', 'p', (8, 8), 'train') == [9.0]
    assert report.round_ratios(ms, 'a', 'missing', (8, 8), 'infer') == []


def test_ratio_per_round_table_needs_two_rounds_and_counts_either_mode():
    data = _synthetic_data()
    assert '### Ratio per round' not in report.render_markdown(data)  # one round
    second = [dict(m, round=1) for m in data['measurements'] if m['mode'] == 'train']
    data['measurements'] += second  # a second round of the training steps only
    row = _row(report.render_markdown(data).split('### Ratio per round')[1], 'Mine')
    # 200²: per round min(12, 18) / min(32, 48) = 0.375 twice; no second inference round
    assert row[1:] == ['Peer', '2', '0.25–0.25 (0.25)', '0.38–0.38 (0.38)']


def test_sizes_beside_the_main_shape_are_drawn_off_the_line():
    sweep = [(512, 512), (800, 1333), (1024, 1024), (1536, 1536)]
    assert report.off_line_shapes(sweep, (800, 1333)) == {(1024, 1024)}
    assert report.off_line_shapes(sweep, (1024, 1024)) == {(800, 1333)}
    assert report.off_line_shapes(sweep, (512, 512)) == set()
    assert report.off_line_shapes([[512, 512], [800, 1333]], []) == set()


def test_parse_shape_and_cases():
    assert bench.parse_shape('800x1333') == (800, 1333)
    assert bench.parse_shape('512') == (512, 512)
    for bad in ('800x', 'abc', '16x16', '1x2x3'):
        with pytest.raises(Exception):
            bench.parse_shape(bad)
    # peers are added, table order is kept
    assert bench.select_cases('lavit-t') == ['PVT-T', 'LaViT-T']
    assert bench.select_cases('LaViT-T', with_peers=False) == ['LaViT-T']
    assert bench.select_cases('all') == list(bench.CASES)
    with pytest.raises(SystemExit, match='FLatten-Swin-T'):
        bench.select_cases('FLatten-Swin')
    for name, (scope, cfg, peer) in bench.CASES.items():
        assert scope in ('mmdet', 'mmeffvit') and 'type' in cfg
        assert peer is None or bench.CASES[peer][0] == 'mmdet', name


def _synthetic_data():
    """Two backbones on two sizes with known numbers: time ∝ pixels^1.5 / ^1.0."""
    shapes = [(100, 100), (200, 200)]

    def meas(name, shape, mode, t, alloc, rss):
        return dict(name=name, shape=list(shape), mode=mode, round=0,
                    result=dict(times=[t, 1.5 * t], alloc_peak=alloc, rss_peak=rss,
                                params=1_000_000))
    ms = []
    for i, s in enumerate(shapes):
        scale = 4 ** i
        ms += [meas('Peer', s, 'infer', 1.0 * scale ** 1.5, 100 * 2**20 * scale, 1e9),
               meas('Peer', s, 'train', 4.0 * scale ** 1.5, 400 * 2**20 * scale, 2e9),
               meas('Mine', s, 'infer', 0.5 * scale, 50 * 2**20 * scale, 1e9),
               meas('Mine', s, 'train', 3.0 * scale, 100 * 2**20 * scale, 1e9)]
    return dict(command='python tools/analysis/benchmark.py', date='today', elapsed_s=1.0,
                options=dict(device='cpu', dtype='float32', isolate='measurement', warmup=1,
                             sweep_warmup=1, reps=1, rounds=1, batch=2, configs=None),
                machine=dict(threads=2), main_shape=[200, 200], shapes=[list(s) for s in shapes],
                cases=[dict(name='Peer', peer=None, softmax=True),
                       dict(name='Mine', peer='Peer', softmax=False)],
                measurements=ms, macs={'Mine': dict(macs=8e9), 'Peer': dict(macs=16e9)},
                gemm={'float32': [dict(n=100, round=0, result=dict(times=[0.01, 0.02],
                                                                   macs=10 ** 9))]})


def _row(markdown, first_cell):
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip('|').split('|')]
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f'no table row {first_cell!r}')


def test_report_tables_from_known_numbers():
    data = _synthetic_data()
    md = report.render_markdown(data)
    speed = _row(md, 'Mine')  # the first table with a 'Mine' row is the speed table
    # 200²: Mine inference 2 s (min of 2, 3), peer 8 s → 0.25×; training 12 / 32 → 0.38×
    assert speed[4] == '2.000 / 2.500'
    assert speed[8] == '0.25× / 0.25×' and speed[9] == '0.38× / 0.38×'  # min / median
    assert speed[6] == '4.0'                      # 8 GMACs / 2 s
    assert speed[7] == '4 %'                      # of the GEMM's 1e9 MACs / 0.01 s = 100 GMAC/s
    fits = report.sweep_fits(data)
    assert fits['Peer']['train_time'] == pytest.approx(1.5)
    assert fits['Mine']['infer_time'] == pytest.approx(1.0)
    assert fits['Mine']['train_alloc'] == pytest.approx(1.0)
    assert fits['Mine']['train_rss'] == pytest.approx(0.0)
    # less the 4 MB of fp32 weights (1 M parameters): (4·100 MiB - 4 MB) / (100 MiB - 4 MB)
    beyond = math.log((4 * 100 * 2**20 - 4e6) / (100 * 2**20 - 4e6)) / math.log(4)
    assert fits['Mine']['train_alloc_beyond_weights'] == pytest.approx(beyond)
    sweep = [line for line in md.splitlines() if line.startswith('| Mine |')][2]
    # growth: Mine (400 - 100) MiB over 0.03 Mpx; Peer (1600 - 400) MiB
    assert fits['Mine']['train_alloc_growth'] == pytest.approx(1e4)
    assert fits['Peer']['train_alloc_growth'] == pytest.approx(4e4)
    assert sweep.rstrip(' |').endswith(f'1.00 | 1.00 | 1.00 | {beyond:.2f} | 0.00 | 10000 | 0.25×')
    peer_sweep = [line for line in md.splitlines() if line.startswith('| Peer |')][1]
    assert peer_sweep.rstrip(' |').endswith('| 40000 | –')


def test_gemm_rate_is_the_fastest_kernels_and_names_the_others():
    # two rounds; oneDNN's best time 0.004 s beats torch.mm's 0.01 s: the machine's rate is
    # oneDNN's (1e9 MACs / 0.004 s = 250 GMAC/s), its median over its own times
    runs = [dict(n=100, round=r, result=dict(
        times=[0.004 + r * 0.002], macs=10 ** 9,
        kernel_times={'torch.mm': [0.01 + r * 0.01], 'oneDNN': [0.004 + r * 0.002]}))
        for r in range(2)]
    rate = report.gemm_rate(runs)
    assert rate['kernel'] == 'oneDNN' and rate['samples'] == 2
    assert rate['best'] == pytest.approx(250.0) and rate['median'] == pytest.approx(200.0)
    assert rate['others'] == {'torch.mm': pytest.approx(100.0)}
    data = _synthetic_data()
    data['gemm']['float32'] = runs
    md = report.render_markdown(data)
    assert 'fastest kernel, oneDNN): **250.0 GMAC/s** best, 200.0 median; torch.mm 100.0' in md
    assert _row(md, 'Mine')[7] == '2 %'  # 4 GMAC/s of 250
    # a run of the older tool (no kernel names) reads as torch.mm's
    legacy = report.gemm_rate(_synthetic_data()['gemm']['float32'])
    assert legacy['kernel'] == 'torch.mm' and legacy['best'] == pytest.approx(100.0)


def test_speed_ratio_of_minima_and_of_medians_differ_when_the_peer_had_one_lucky_round():
    data = _synthetic_data()
    for m in data['measurements']:
        if m['name'] == 'Peer' and m['mode'] == 'infer' and m['shape'] == [200, 200]:
            m['result']['times'] = [4.0, 10.0, 10.0]  # one fast round of three
    speed = _row(report.render_markdown(data), 'Mine')
    # Mine: times 2.0 and 3.0 (min 2.0, median 2.5); the peer min 4.0, median 10.0
    assert speed[8] == '0.50× / 0.25×'


def test_report_note():
    data = _synthetic_data()
    assert '**Note.**' not in report.render_markdown(data)
    data['note'] = 'the machine was shared'
    assert '**Note.** the machine was shared' in report.render_markdown(data)


def test_report_marks_failures():
    data = _synthetic_data()
    data['measurements'][-1]['result'] = dict(error='RuntimeError: out of memory')
    md = report.render_markdown(data)
    assert 'Mine 200² train: RuntimeError: out of memory' in md
    assert _row(md, 'Mine')[5] == '– / –' and _row(md, 'Mine')[9] == '– / –'


def test_quick_run_end_to_end(tmp_path):
    """The tool on two cases at tiny sizes: tables, plots and consistent numbers."""
    out = tmp_path / 'bench.md'
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    proc = subprocess.run(
        [sys.executable, TOOL, '--quick', '--cases', 'FLatten-PVTv2-B0', '--sweep', '64',
         '--shape', '96x128', '--threads', '1', '--out', str(out)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r'\[\s*\d+/\d+\] FLatten-PVTv2-B0 96×128 train r1: .* ETA', proc.stderr)
    md = out.read_text()
    data = json.loads((tmp_path / 'bench' / 'results.json').read_text())
    for name in ('latency', 'memory'):
        png = (tmp_path / 'bench' / f'{name}.png').read_bytes()
        assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10_000
        assert f'![{name}](bench/{name}.png)' in md
    assert [c['name'] for c in data['cases']] == ['PVTv2-B0', 'FLatten-PVTv2-B0']
    assert len(data['measurements']) == 2 * 2 * 2  # cases × sizes × modes, one round
    stats = report.summarise(data['measurements'])
    for (name, shape, mode), s in stats.items():
        assert not s['errors'], (name, shape, mode, s['errors'])
        assert 0 < s['min'] <= s['median']
        assert s['rss_peak'] > s['alloc_peak'] > 4 * s['params']  # fp32 weights are in it
    for name in ('PVTv2-B0', 'FLatten-PVTv2-B0'):
        for shape in ((64, 64), (96, 128)):
            # a training step holds activations and gradients on top of the inference peak
            assert stats[(name, shape, 'train')]['alloc_peak'] > \
                stats[(name, shape, 'infer')]['alloc_peak']
        # a 3× larger input needs more memory (the sweep's memory axis is not flat noise)
        assert stats[(name, (96, 128), 'train')]['alloc_peak'] > \
            stats[(name, (64, 64), 'train')]['alloc_peak']
    gemm = data['gemm']['float32'][0]['result']
    assert gemm['gmacs_per_s'] > 0
    # both CPU fp32 GEMMs are timed (oneDNN's where this torch has it); the rate is the faster's
    from mmeffvit.ops.policy import ONEDNN_LINEAR
    assert set(gemm['kernel_times']) == {'torch.mm'} | ({'oneDNN'} if ONEDNN_LINEAR else set())
    assert min(gemm['times']) == min(min(t) for t in gemm['kernel_times'].values())
    # which GEMM mmeffvit's linears ran on depends on the CPU: the report says it
    from mmeffvit.ops.policy import policy
    assert data['machine']['linear_kernel'] == policy().cpu_gemm
    assert data['machine']['cpu_capability'] in md and "mmeffvit's linear layers on" in md

    # the table shows these numbers: params, GMACs, ratio to the peer
    import torch

    import mmeffvit  # noqa: F401
    from mmeffvit.registry import MODELS
    try:
        from mmeffvit.analysis.complexity import analyze
    except ImportError:
        from mmeffvit.utils.complexity import analyze
    torch.manual_seed(0)
    model = MODELS.build(dict(bench.CASES['FLatten-PVTv2-B0'][1]))
    model.eval()
    expected = analyze(model, torch.rand(1, 3, 96, 128))
    assert data['macs']['FLatten-PVTv2-B0']['macs'] == expected.macs
    row = _row(md, 'FLatten-PVTv2-B0')
    assert row[1] == 'PVTv2-B0'
    assert row[2] == f'{expected.params / 1e6:.2f}'
    mine, peer = stats[('FLatten-PVTv2-B0', (96, 128), 'infer')], \
        stats[('PVTv2-B0', (96, 128), 'infer')]
    assert row[8] == f"{mine['min'] / peer['min']:.2f}× / {mine['median'] / peer['median']:.2f}×"
    assert '## Resolution sweep' in md and 'b train alloc' in md


@pytest.mark.slow
def test_detector_mode(tmp_path):
    """--config: images/s of test_step and train_step of a detector and a segmentor."""
    out = tmp_path / 'det.md'
    configs = [osp.join('configs', 'demo', 'mask_rcnn_flatten_pvt_t_1x_shapes.py'),
               osp.join('configs', 'demo', 'fpn_flatten_pvt_t_80k_shapes.py')]
    proc = subprocess.run(
        [sys.executable, TOOL, '--config', *configs, '--shape', '96x128', '--batch', '2',
         '--rounds', '1', '--warmup', '0', '--threads', '1', '--out', str(out)],
        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=REPO_ROOT), capture_output=True,
        text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / 'det' / 'results.json').read_text())
    assert len(data['measurements']) == 4
    for m in data['measurements']:
        assert 'error' not in m['result'], m
        assert m['result']['times'][0] > 0
    md = out.read_text()
    for cfg in configs:
        row = _row(md, cfg)
        assert float(row[2].split(' / ')[0]) > 0 and float(row[5].split(' / ')[0]) > 0


def _load_profile_tool():
    path = osp.join(REPO_ROOT, 'tools', 'analysis', 'profile_backbone.py')
    spec = importlib.util.spec_from_file_location('profile_backbone_tool', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gemm_macs_from_recorded_shapes():
    from mmeffvit.analysis import benchmark_worker as worker
    assert worker._gemm_macs('aten::mm', [[64, 32], [32, 16]]) == 64 * 32 * 16
    assert worker._gemm_macs('aten::addmm', [[16], [64, 32], [32, 16], [], []]) == 64 * 32 * 16
    assert worker._gemm_macs('aten::bmm', [[8, 49, 32], [8, 32, 49]]) == 8 * 49 * 32 * 49
    assert worker._gemm_macs('aten::baddbmm', [[8, 49, 49], [8, 49, 32], [8, 32, 49], [], []]) \
        == 8 * 49 * 32 * 49
    assert worker._gemm_macs('aten::mm', [[]]) is None


def test_profile_report_keeps_the_hand_written_text(tmp_path):
    tool = _load_profile_tool()
    result = dict(warm_s=1.0, profiled_s=1.2, total_us=1000.0,
                  ops=[['aten::addmm', 4, 600.0], ['aten::copy_', 10, 300.0],
                       ['aten::item', 2, 100.0]],
                  syncs={'aten::item': 2, 'aten::_local_scalar_dense': 2},
                  copies={'aten::copy_': [10, 300.0]},
                  gemm=dict(calls=4, us=600.0, macs=6e9, median_macs=1.5e9, small_calls=0),
                  owners=[['mmeffvit/models/backbones/x.py(10): forward', 900.0]], backward=[])
    data = dict(command='python tools/analysis/profile_backbone.py', date='today', shape=[64, 64],
                threads=2, host={}, cases=['X'], modes=['infer'], results={'X': {'infer': result}})
    out = tmp_path / 'profiles.md'
    out.write_text(f'# Title\n\nintro\n\n{tool.START}\nold numbers\n{tool.END}\n\n## Diagnosis\n'
                   'kept\n')
    tool.write(data, str(out), top=10)
    text = out.read_text()
    assert text.startswith('# Title\n\nintro\n') and text.endswith('## Diagnosis\nkept\n')
    assert 'old numbers' not in text
    assert '| `aten::addmm` | 4 | 60.0 % |' in text
    assert '`aten::_local_scalar_dense` ×2' in text
    # 6 GMACs in 600 µs of GEMM kernels
    assert '6.0 GMACs at 10000 GMAC/s inside them' in text
    assert '| X | infer | `aten::addmm` 60.0 % | 60.0 % | 30.0 % | 2 | 16 |' in text
