"""The study scripts' plumbing (tools/analysis/study_runs.py, learning_table.py, pretrain_study.py),
the cost hook, and a classifier's checkpoint starting a dense model's backbone."""
import json
import os.path as osp
import statistics
import sys
import types

import pytest
import torch
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis'))

import learning_table  # noqa: E402
import pretrain_study  # noqa: E402
import study_runs  # noqa: E402


def _load(tmp_path, text):
    path = tmp_path / 'cfg.py'
    path.write_text(text)
    return Config.fromfile(str(path))


def test_learning_table_run_config_swaps_only_the_backbone(tmp_path):
    cfg = _load(tmp_path, learning_table.run_text('pvt_t', 3, learning_table.FULL))
    demo = Config.fromfile(osp.join(ROOT, learning_table.SEG_DEMO))
    assert cfg.model.backbone.type == 'mmdet.PyramidVisionTransformer'
    assert cfg.model.backbone.init_cfg is None and 'mmdet.models' in cfg.custom_imports.imports
    assert cfg.model.neck.in_channels == [64, 128, 320, 512]
    # the demo's model and optimiser stay
    assert cfg.model.decode_head == demo.model.decode_head
    assert cfg.optim_wrapper == demo.optim_wrapper
    assert cfg.randomness == dict(seed=3, deterministic=True)
    assert [h.type for h in cfg.custom_hooks] == ['IterCostHook']
    full = learning_table.FULL
    assert cfg.train_cfg.max_iters == full['iters']
    assert cfg.train_dataloader.batch_size == full['batch']
    assert cfg.model.data_preprocessor.size == (full['crop'], full['crop'])
    assert cfg.param_scheduler[-1].end == full['iters']


@pytest.mark.parametrize('name', sorted(learning_table.MODELS))
def test_every_table_backbone_is_random_and_replaces_the_demo_one(name):
    backbone = learning_table.backbone_dict(learning_table.MODELS[name][2])
    assert backbone['init_cfg'] is None and backbone['_delete_'] is True
    assert backbone['type']


def test_lavit_runs_add_the_diagonality_loss(tmp_path):
    cfg = _load(tmp_path, learning_table.run_text('lavit_t', 0, learning_table.QUICK))
    assert cfg.model.type == 'AuxLossEncoderDecoder' and cfg.model.with_backbone_aux_loss


def test_pretrained_fine_tuning_loads_the_classifier_backbone(tmp_path):
    text = pretrain_study.seg_text('flatten_pvt_t', 1, pretrain_study.FULL, '/x/iter_300.pth')
    cfg = _load(tmp_path, text)
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint='/x/iter_300.pth',
                                               prefix='backbone.')
    scratch = _load(tmp_path, pretrain_study.seg_text('flatten_pvt_t', 1, pretrain_study.FULL))
    assert scratch.model.backbone.init_cfg is None
    cfg.model.backbone.init_cfg = None
    assert cfg.to_dict() == scratch.to_dict()  # the same run but for the initialisation


def test_scratch_arm_is_the_learning_tables_run_when_the_sizes_agree(tmp_path, monkeypatch):
    """With the learning table's sizes the study's from-scratch runs are the table's, config and
    all; with its own sizes (or --quick / --work-dir) they stay in the study's work dir."""
    args = pretrain_study.parse_args([])
    own = pretrain_study._seg_sizes(learning_table.FULL) != pretrain_study.FULL['seg']
    assert pretrain_study.scratch_dir('/w', 'lavit_t', 1, args) == (
        '/w/fpn_lavit_t_scratch_seed1' if own
        else osp.join(ROOT, 'work_dirs', 'learning', 'lavit_t_seed1'))
    shared = dict(pretrain_study.FULL, seg=pretrain_study._seg_sizes(learning_table.FULL))
    monkeypatch.setattr(pretrain_study, 'FULL', shared)
    for name in pretrain_study.BACKBONES:
        run_dir = pretrain_study.scratch_dir('/w', name, 1, args)
        assert run_dir == osp.join(ROOT, 'work_dirs', 'learning', f'{name}_seed1')
        assert (pretrain_study.seg_text(name, 1, shared)
                == learning_table.run_text(name, 1, learning_table.FULL))
    quick = pretrain_study.parse_args(['--quick'])
    assert pretrain_study.scratch_dir('/w', 'lavit_t', 0, quick) == '/w/fpn_lavit_t_scratch_seed0'


def test_detection_arm_and_pretraining_configs(tmp_path):
    det = _load(tmp_path, pretrain_study.det_text(0, pretrain_study.FULL, '/x/c.pth'))
    assert det.model.backbone.init_cfg.prefix == 'backbone.'
    assert det.train_cfg.max_iters == pretrain_study.FULL['det_iters']
    cls = _load(tmp_path, pretrain_study.cls_text('flatten_pvt_t', pretrain_study.FULL))
    assert cls.model.type == 'ImageClassifier' and cls.model.head.num_classes == 8
    assert cls.train_cfg.max_iters == pretrain_study.FULL['cls_iters']
    assert cls.default_hooks.checkpoint.interval == cls.train_cfg.max_iters
    assert cls.train_cfg.val_interval == cls.train_cfg.max_iters // 4


def test_classifier_checkpoint_starts_the_segmentor_backbone(tmp_path):
    """init_cfg=Pretrained(prefix='backbone.') takes exactly the classifier's backbone weights."""
    import mmeffvit  # noqa: F401
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS as CLS_MODELS
    from mmseg.registry import MODELS as SEG_MODELS
    init_default_scope('mmpretrain')
    cls_cfg = Config.fromfile(osp.join(ROOT, 'configs/demo/cls_flatten_pvt_t_300e_shapes.py'))
    classifier = CLS_MODELS.build(cls_cfg.model)
    classifier.init_weights()
    with torch.no_grad():  # not the random init a segmentor would also draw
        for p in classifier.backbone.parameters():
            p.add_(0.5)
    ckpt = tmp_path / 'cls.pth'
    torch.save(dict(state_dict=classifier.state_dict(), meta=dict()), ckpt)

    init_default_scope('mmseg')
    seg_cfg = Config.fromfile(osp.join(ROOT, 'configs/demo/fpn_flatten_pvt_t_80k_shapes.py'))
    seg_cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=str(ckpt),
                                           prefix='backbone.')
    segmentor = SEG_MODELS.build(seg_cfg.model)
    segmentor.init_weights()
    mine = segmentor.backbone.state_dict()
    theirs = classifier.backbone.state_dict()
    assert set(mine) == set(theirs)
    for key, value in theirs.items():
        torch.testing.assert_close(mine[key], value, rtol=0, atol=0, msg=key)


def _write_log(work_dir, records):
    vis = work_dir / '20260101_000000' / 'vis_data'
    vis.mkdir(parents=True)
    (vis / 'scalars.json').write_text('\n'.join(json.dumps(r) for r in records) + '\n')


def test_summarise_reads_metrics_and_cost(tmp_path):
    _write_log(tmp_path, [
        dict(lr=1e-3, loss=2.0, time=9.0, cpu_time=5.0, peak_rss_mb=1000., iter=1, step=1),
        dict(lr=1e-3, loss=1.5, time=2.0, cpu_time=1.0, peak_rss_mb=1200., iter=2, step=2),
        dict(mIoU=30.0, aAcc=85.0, time=0.5, data_time=0.1, step=2),
        dict(lr=1e-3, loss=1.0, time=4.0, cpu_time=3.0, peak_rss_mb=1100., iter=3, step=3),
        dict(mIoU=41.5, aAcc=90.0, time=0.5, data_time=0.1, step=3),
    ])
    summary = study_runs.summarise(str(tmp_path))
    assert summary['metrics'] == dict(mIoU=41.5, aAcc=90.0)
    assert summary['first_metrics'] == dict(mIoU=30.0, aAcc=85.0)
    assert summary['first_val_iter'] == 2
    assert summary['last_loss'] == pytest.approx(1.5)  # mean of the logged losses (< 5 of them)
    assert summary['iters'] == 3
    assert summary['time'] == pytest.approx(3.0)  # the first (start-up) interval left out
    assert summary['cpu_time'] == pytest.approx(2.0)
    assert summary['peak_rss_mb'] == 1200.


def test_summarise_refuses_a_run_without_metrics(tmp_path):
    _write_log(tmp_path, [dict(lr=1e-3, loss=2.0, time=1.0, step=1)])
    with pytest.raises(study_runs.StudyError, match='no validation metric'):
        study_runs.summarise(str(tmp_path))


def _finished_run(work_dir, text, **summary):
    """A run dir as train() leaves it: logs and a summary for ``text``."""
    _write_log(work_dir, [dict(lr=1e-3, loss=1.0, time=1.0, cpu_time=1.0, peak_rss_mb=1e3,
                               iter=1, step=1), dict(mIoU=1.0, step=1)])
    summary.setdefault('config_sha256', study_runs.hashlib.sha256(text.encode()).hexdigest())
    (work_dir / 'summary.json').write_text(json.dumps(summary))


def _failing_training(monkeypatch):
    def fail(cmd, **kwargs):
        kwargs['stdout'].write('Traceback ...\nValueError: broken config\n')
        return types.SimpleNamespace(returncode=1)
    monkeypatch.setattr(study_runs.subprocess, 'run', fail)


def _run_on_a_base(tmp_path):
    """A base config, a run's text inheriting it, and its (empty) work dir."""
    base = tmp_path / 'base.py'
    base.write_text('lr = 0.1\n')
    work_dir = tmp_path / 'run'
    work_dir.mkdir()
    return base, study_runs.config_text(str(base), 0), work_dir


def test_train_reuses_a_finished_run_and_reports_a_failed_one(tmp_path, monkeypatch):
    _, text, work_dir = _run_on_a_base(tmp_path)
    _finished_run(work_dir, text, metrics=dict(mIoU=1.0), wall_s=5.0)
    _failing_training(monkeypatch)
    reused = study_runs.train(str(work_dir), text, log=lambda *a: None)
    # the summary of an older version gains what the logs give, and the resolved digest
    assert reused['metrics'] == dict(mIoU=1.0) and reused['wall_s'] == 5.0
    assert reused['first_metrics'] == dict(mIoU=1.0) and reused['last_loss'] == 1.0
    assert reused['resolved_sha256'] == study_runs.resolved_digest(text)
    assert json.loads((work_dir / 'summary.json').read_text()) == reused
    assert study_runs.train(str(work_dir), text, log=lambda *a: None) == reused
    with pytest.raises(study_runs.StudyError, match='broken config'):
        study_runs.train(str(work_dir), text + '# changed\n', log=lambda *a: None)
    assert not (work_dir / 'summary.json').exists()  # the stale run was cleared


def test_train_retrains_when_an_inherited_config_changed(tmp_path, monkeypatch):
    base, text, work_dir = _run_on_a_base(tmp_path)
    _finished_run(work_dir, text, metrics=dict(mIoU=1.0),
                  resolved_sha256=study_runs.resolved_digest(text))
    _failing_training(monkeypatch)
    assert study_runs.train(str(work_dir), text, log=lambda *a: None)['metrics'] == dict(mIoU=1.0)
    base.write_text('lr = 0.2\n')  # the generated text is unchanged, what it resolves to is not
    with pytest.raises(study_runs.StudyError, match='broken config'):
        study_runs.train(str(work_dir), text, log=lambda *a: None)


def test_check_loaded(tmp_path):
    (tmp_path / 'train.log').write_text('FLattenPVT: 100 of 100 tensors from /c/iter_2.pth; '
                                        'missing: none\n')
    pretrain_study.check_loaded(str(tmp_path), '/c/iter_2.pth')
    (tmp_path / 'train.log').write_text('FLattenPVT: pretrained checkpoint /c/iter_2.pth not '
                                        'found; the backbone keeps its random initialisation\n')
    with pytest.raises(study_runs.StudyError, match='did not report'):
        pretrain_study.check_loaded(str(tmp_path), '/c/iter_2.pth')


def test_mean_std_matches_statistics():
    values = [41.2, 38.9, 44.0]
    assert study_runs.mean_std(values) == pytest.approx(
        (statistics.mean(values), statistics.stdev(values)))
    assert study_runs.mean_std([3.0]) == (3.0, 0.0)
    assert study_runs.fmt_mean_std([3.0]) == '3.0 (one seed)'
    assert study_runs.fmt_mean_std(values) == (
        f'{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}')


def test_cost_hook_logs_cpu_time_and_peak_memory():
    from mmengine.logging import MessageHub
    from mmeffvit.engine.cost_hook import IterCostHook
    hub = MessageHub.get_instance('test_cost_hook')
    runner = types.SimpleNamespace(message_hub=hub)
    hook = IterCostHook()
    hook.after_train_iter(runner, 0)  # no start recorded: nothing logged
    assert 'train/cpu_time' not in hub.log_scalars
    hook.before_train_iter(runner, 0)
    sum(i * i for i in range(200000))  # some CPU work
    hook.after_train_iter(runner, 0)
    assert hub.get_scalar('train/cpu_time').current() > 0
    assert hub.get_scalar('train/peak_rss_mb').current() > 10  # this process holds torch


@pytest.mark.parametrize('warmup,iters', [(8, 80), (8, 6), (1, 2), (5, 1)])
def test_warmup_then_decay_fits_any_length(warmup, iters):
    decay = dict(type='PolyLR', power=0.9, by_epoch=False)
    schedule = learning_table.warmup_then(decay, warmup, iters)
    assert schedule[0]['type'] == 'LinearLR' and schedule[0]['begin'] == 0
    for a, b in zip(schedule, schedule[1:]):
        assert a['end'] == b['begin'] < b['end'] == iters
    assert all(s['begin'] < s['end'] for s in schedule)
    assert schedule[-1]['end'] <= max(iters, 1)


def test_pretrain_report_from_run_summaries(tmp_path):
    """The report writes every arm's mean ± std and names the backbones left out of the run."""
    def run(metrics):
        return dict(metrics=metrics, time=0.5, cpu_time=0.9, peak_rss_mb=1400.0, wall_s=60.0)
    cls = {'flatten_pvt_t': run({'accuracy/top1': 30.0, 'accuracy/top5': 80.0})}
    seg = {'flatten_pvt_t': ([dict(run({'mIoU': 17.55}), first_metrics={'mIoU': 17.55},
                                   first_val_iter=50, last_loss=0.5)] * 3,
                             [dict(run({'mIoU': m}), first_metrics={'mIoU': m - 1},
                                   first_val_iter=50, last_loss=0.3) for m in (20.0, 21.0, 22.0)])}
    det = ([run({'coco/bbox_mAP': 0.01, 'coco/segm_mAP': 0.02})],
           [run({'coco/bbox_mAP': 0.05, 'coco/segm_mAP': 0.04})])
    out = tmp_path / 'pretraining.md'
    pretrain_study.write_report(str(out), pretrain_study.FULL, 'python x', cls, seg, det,
                                [str(tmp_path / 'a.png')], 600.0)
    text = out.read_text()
    assert ('| FLatten-PVT-T | pretrained on shapes | 21.0 ± 1.0 | 20.0 ± 1.0 (iter 50) | '
            '0.300 ± 0.000 | 0.90 |') in text
    assert '| FLatten-PVT-T | from scratch | 17.6 ± 0.0 |' in text
    assert '| pretrained on shapes | 0.050 (one seed) | 0.040 (one seed) |' in text
    assert 'Not in this run: LaViT-T' in text and '![a.png](a.png)' in text
    assert '9 min in all (this invocation: 10 min' in text  # 9 runs of 60 s


def test_learning_report_compares_each_backbone_with_its_softmax_peer(tmp_path):
    def run(miou, cpu):
        return dict(metrics={'mIoU': miou}, first_metrics={'mIoU': 17.55}, last_loss=0.4,
                    time=1.0, cpu_time=cpu, peak_rss_mb=1500.0, wall_s=120.0)
    results = {'flatten_pvt_t': [run(m, 1.0) for m in (20.0, 21.0, 22.0)],
               'pvt_t': [run(m, 0.8) for m in (21.0, 23.0, 25.0)],
               'care_s0': [run(18.0, 0.5)]}  # its peer (Swin-T) is not in this table
    out = tmp_path / 'learning.md'
    learning_table.write_report(str(out), results, learning_table.FULL, 'python x',
                                [str(tmp_path / 'l.png')], 60.0)
    text = out.read_text()
    # 21 vs 23: -2.0, the larger std is 2.0 -> -1.0 std; CPU 1.0 / 0.8
    assert ('| FLatten-PVT-T | focused linear | 21.0 ± 1.0 | 17.6 ± 0.0 | 0.400 ± 0.000 | '
            'PVT-T: -2.0 (-1.0) / 1.25× | 1.00 | 1.00 | 1500 |') in text
    assert '| CARE-S0 | asymmetric linear | 18.0 (one seed) | 17.6 (one seed) |' in text
    assert '| – |' in text.split('CARE-S0')[1].splitlines()[0]
    assert '14 min in all' in text  # 7 runs of 120 s
