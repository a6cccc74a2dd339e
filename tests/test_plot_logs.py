"""tools/analysis/plot_logs.py on synthetic mmengine vis_data logs (the end-to-end check on real
training logs is in tests/test_image_demo.py, which trains)."""
import importlib.util
import json
import math
import os
import os.path as osp
import re

import numpy as np
import pytest
from PIL import Image

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _load_tool():
    path = osp.join(REPO_ROOT, 'tools', 'analysis', 'plot_logs.py')
    spec = importlib.util.spec_from_file_location('_tool_plot_logs', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plot_logs = _load_tool()


def train_record(step, loss):
    return {'lr': 1e-4, 'data_time': 0.01, 'loss': loss, 'loss_cls': loss / 2,
            'time': 1.0, 'iter': step, 'step': step}


def write_log(work_dir, stamp, records, name='scalars.json'):
    vis = osp.join(work_dir, stamp, 'vis_data')
    os.makedirs(vis, exist_ok=True)
    with open(osp.join(vis, name), 'w') as f:
        for record in records:
            f.write(json.dumps(record) + '\n')
    return vis


def det_like_run(work_dir, loss0=2.0):
    """20 iterations, validation logged by epoch (step 0) after iteration 10, and by iteration
    (step 20) at the end, as mmdet's and mmseg's configs do."""
    records = [train_record(i, loss0 / i) for i in range(1, 11)]
    records.append({'coco/bbox_mAP': 0.1, 'coco/bbox_mAP_l': -1.0, 'time': 0.5, 'step': 0})
    records += [train_record(i, loss0 / i) for i in range(11, 21)]
    records.append({'coco/bbox_mAP': 0.3, 'coco/bbox_mAP_l': 0.2, 'time': 0.5, 'step': 20})
    write_log(str(work_dir), '20260101_000000', records)
    return str(work_dir)


def test_reads_train_and_places_metrics_at_iterations(tmp_path):
    run = plot_logs.Run('a', plot_logs.find_scalar_logs(det_like_run(tmp_path)))
    xs, ys = run.series('loss')
    assert xs == list(range(1, 21)) and ys[0] == 2.0 and ys[-1] == pytest.approx(0.1)
    # the epoch-logged metric (step 0) sits after iteration 10, the other at its own step
    assert run.series('coco/bbox_mAP') == ([10, 20], [0.1, 0.3])
    # COCO's -1 (no object of that size) is not drawn as a score
    xs, ys = run.series('coco/bbox_mAP_l')
    assert math.isnan(ys[0]) and ys[1] == 0.2
    # bookkeeping fields are not curves
    assert 'step' not in run.keys() and 'iter' not in run.keys()


def test_resumed_run_replaces_points_after_its_start(tmp_path):
    det_like_run(tmp_path)
    # resumed from iteration 15: its points replace 16..20, the validation at 20 too
    resumed = [train_record(i, 5.0) for i in range(16, 26)]
    resumed.append({'coco/bbox_mAP': 0.5, 'step': 25})
    write_log(str(tmp_path), '20260102_000000', resumed)
    run = plot_logs.Run('a', plot_logs.find_scalar_logs(str(tmp_path)))
    xs, ys = run.series('loss')
    assert xs == list(range(1, 26))
    assert ys[14] == pytest.approx(2.0 / 15) and ys[15:] == [5.0] * 10
    assert run.series('coco/bbox_mAP') == ([10, 25], [0.1, 0.5])


def test_scalars_json_preferred_over_timestamped_copy(tmp_path):
    vis = write_log(str(tmp_path), '20260101_000000', [train_record(1, 1.0)])
    write_log(str(tmp_path), '20260101_000000', [train_record(1, 1.0), train_record(2, 9.0)],
              name='20260101_000000.json')
    assert plot_logs.find_scalar_logs(str(tmp_path)) == [osp.join(vis, 'scalars.json')]
    # without scalars.json the timestamped file is read; a vis_data dir or file works too
    os.remove(osp.join(vis, 'scalars.json'))
    stamped = [osp.join(vis, '20260101_000000.json')]
    assert plot_logs.find_scalar_logs(str(tmp_path)) == stamped
    assert plot_logs.find_scalar_logs(vis) == stamped
    assert plot_logs.find_scalar_logs(stamped[0]) == stamped


def test_trailing_mean_against_numpy():
    values = list(np.random.default_rng(0).normal(size=40))
    ours = plot_logs.trailing_mean(values, 5)
    ref = [np.mean(values[max(0, i - 4):i + 1]) for i in range(40)]
    np.testing.assert_allclose(ours, ref)
    assert plot_logs.trailing_mean([1.0, math.nan, 3.0], 2) == [1.0, 1.0, 3.0]


def test_select_keys_follows_patterns(tmp_path):
    run = plot_logs.Run('a', plot_logs.find_scalar_logs(det_like_run(tmp_path)))
    assert plot_logs.select_keys([run], plot_logs.DEFAULT_KEYS) == [
        'loss', 'loss_cls', 'coco/bbox_mAP']
    assert plot_logs.select_keys([run], ['lr', 'loss']) == ['lr', 'loss']
    with pytest.raises(plot_logs.LogError, match='the logs hold: lr, data_time, loss'):
        plot_logs.select_keys([run], ['mIoU'])


def _colour_pixels(png, rgb, tol=30):
    img = np.asarray(Image.open(png).convert('RGB')).astype(int)
    return int((np.abs(img - np.array(rgb)).sum(-1) < tol).sum())


def test_two_runs_in_one_png(tmp_path, capsys):
    a = det_like_run(tmp_path / 'run_a')
    b = det_like_run(tmp_path / 'run_b', loss0=4.0)
    out = str(tmp_path / 'both.png')
    assert plot_logs.main([a, b, '--smooth', '3', '--out', out]) == 0
    text = capsys.readouterr().out
    assert 'run_a: loss 0.1 at iteration 20 (first 2)' in text
    assert 'run_b: coco/bbox_mAP best 0.3 at iteration 20' in text
    img = Image.open(out)
    assert img.format == 'PNG' and img.size == (1560, 360)  # 3 panels of 5.2 x 3.6 in, 100 dpi
    # matplotlib's first two colours: one per run, both drawn
    assert _colour_pixels(out, (31, 119, 180)) > 500 and _colour_pixels(out, (255, 127, 14)) > 500


def test_default_output_next_to_a_single_run(tmp_path):
    work = det_like_run(tmp_path / 'only')
    assert plot_logs.main([work]) == 0
    assert osp.isfile(osp.join(work, 'curves.png'))


def test_non_finite_loss_is_reported_and_drawn_around(tmp_path, capsys):
    records = [train_record(i, 1.0) for i in range(1, 6)]
    records[2]['loss'] = float('nan')
    write_log(str(tmp_path), '20260101_000000', records)
    assert plot_logs.main([str(tmp_path), '--keys', 'loss']) == 0
    assert 'loss is not finite at iterations [3]' in capsys.readouterr().out


@pytest.mark.parametrize('content, message', [
    ('{"loss": 1.0, "lr": 1, "step": 1}\n{"loss": 1.0, "st', r'scalars.json:2 is not a json'),
    ('[1, 2]\n', r'scalars.json:1 holds list'),
    ('\n', r'hold no scalar records'),
])
def test_corrupt_logs_fail_clearly(tmp_path, capsys, content, message):
    vis = tmp_path / '20260101_000000' / 'vis_data'
    vis.mkdir(parents=True)
    (vis / 'scalars.json').write_text(content)
    assert plot_logs.main([str(tmp_path)]) == 1
    assert re.search(message, capsys.readouterr().err)


def test_missing_logs_fail_clearly(tmp_path, capsys):
    assert plot_logs.main([str(tmp_path)]) == 1
    assert 'no vis_data/*.json under' in capsys.readouterr().err
    assert plot_logs.main([str(tmp_path / 'nope')]) == 1
    assert 'neither a work dir nor a json log' in capsys.readouterr().err


def test_argument_errors(tmp_path):
    with pytest.raises(SystemExit):
        plot_logs.main([str(tmp_path), '--labels', 'a', 'b'])
    with pytest.raises(SystemExit):
        plot_logs.main([str(tmp_path), '--smooth', '0'])


def test_default_labels_tell_runs_apart():
    assert plot_logs.default_labels(['w/a/det', 'w/b/det']) == ['a/det', 'b/det']
    assert plot_logs.default_labels(['w/x', 'w/y']) == ['x', 'y']
