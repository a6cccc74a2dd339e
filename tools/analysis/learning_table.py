"""Does efficient attention learn as well as softmax at equal cost? ``docs/learning.md``.

Each family's smallest variant and the softmax peers that mmdet ships (PVT-T, PVTv2-B0, Swin-T)
train as Semantic FPN backbones on the ADE20K-layout copy of the embedded shapes data, from
scratch, with one schedule and the same seeds: the segmentation demo's model and optimiser
(configs/demo/fpn_flatten_pvt_t_80k_shapes.py: FPN + FPN head, AdamW lr 2e-4, batch 4, linear
warm-up then poly decay) with only the backbone (and the neck's input channels) swapped. The
table gives the mean ± std over the seeds of the last mIoU, and the cost beside it: wall and CPU
seconds per training iteration and the peak resident memory of the training process
(mmeffvit.engine.cost_hook.IterCostHook; the framework alone holds about 1 GiB of it). Curves of
loss and mIoU vs iteration (tools/analysis/plot_logs.py) go to docs/learning_*.png.

    # the table in docs/ (177 min of one core measured: see FULL below; two processes with disjoint
    # --models and the same --work-dir share the cores, a last call reuses their runs)
    python tools/analysis/learning_table.py
    # a check that every model trains (minutes; writes to work_dirs/learning_quick/ only)
    python tools/analysis/learning_table.py --quick

Runs are seeded and deterministic, so the same command gives the same mIoU; finished runs are
reused when the command is repeated (``--fresh`` trains everything again). Wall-clock columns
depend on how busy the machine is; the CPU-seconds column much less so.
"""
import argparse
import os.path as osp
import subprocess
import sys
import time

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from study_runs import (REPO, StudyError, config_text, fmt_mean_std, mean_std,  # noqa: E402
                        plot, train)

SEG_DEMO = 'configs/demo/fpn_flatten_pvt_t_80k_shapes.py'


def _base_backbone(path, key='backbone', **overrides):
    """The backbone dict a repository config defines (``backbone`` or ``model.backbone``), with
    ``overrides``."""
    return ('base', path, key, overrides)


# name -> (label, attention, backbone (a dict, or where to read it), neck in_channels)
MODELS = {
    'flatten_pvt_t': ('FLatten-PVT-T', 'focused linear',
                      _base_backbone('configs/_base_/backbones/flatten_pvt_t.py'),
                      [64, 128, 320, 512]),
    'pvt_t': ('PVT-T (mmdet)', 'softmax (spatial reduction)',
              dict(type='mmdet.PyramidVisionTransformer', num_layers=[2, 2, 2, 2],
                   drop_path_rate=0.1),
              [64, 128, 320, 512]),
    'flatten_pvtv2_b0': ('FLatten-PVTv2-B0', 'focused linear',
                         _base_backbone('configs/flatten/fpn_flatten_pvtv2_b0_80k_ade20k.py',
                                        'model.backbone'),
                         [32, 64, 160, 256]),
    'pvtv2_b0': ('PVTv2-B0 (mmdet)', 'softmax (spatial reduction)',
                 dict(type='mmdet.PyramidVisionTransformerV2', embed_dims=32,
                      num_layers=[2, 2, 2, 2], drop_path_rate=0.1),
                 [32, 64, 160, 256]),
    'flatten_swin_t': ('FLatten-Swin-T', 'focused linear + windows',
                       _base_backbone('configs/_base_/backbones/flatten_swin_t.py'),
                       [96, 192, 384, 768]),
    'swin_t': ('Swin-T (mmdet)', 'softmax (windows)',
               dict(type='mmdet.SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                    num_heads=[3, 6, 12, 24], window_size=7, drop_path_rate=0.2),
               [96, 192, 384, 768]),
    'flatten_cswin_t': ('FLatten-CSWin-T', 'focused linear + cross-shaped windows',
                        _base_backbone('configs/_base_/backbones/flatten_cswin_t.py'),
                        [64, 128, 256, 512]),
    # windows of 64x64 pixels, as the shapes classifier (configs/demo/cls_lavit_t_300e_shapes.py)
    # whose checkpoint pretrain_study.py loads: at the default 224 a 128x128 crop is padded into
    # one 14x14 window at stage 3 (1.04 vs 0.57 GMAC)
    'lavit_t': ('LaViT-T', 'less attention',
                _base_backbone('configs/_base_/backbones/lavit_t.py', pretrain_img_size=64),
                [64, 128, 320, 448]),
    'care_s0': ('CARE-S0', 'asymmetric linear',
                _base_backbone('configs/_base_/backbones/care_s0.py'), [32, 64, 128, 1024]),
    'l2vit_t': ('L2ViT-T', 'linear global + local window',
                _base_backbone('configs/_base_/backbones/l2vit_t.py'), [96, 192, 384, 768]),
    'focal_t': ('Focal-T', 'focal (softmax, multi-level)',
                _base_backbone('configs/_base_/backbones/focal_t.py'), [96, 192, 384, 768]),
}
# the softmax backbone of mmdet each efficient one is compared with (its width class)
PEERS = {'flatten_pvt_t': 'pvt_t', 'lavit_t': 'pvt_t', 'flatten_pvtv2_b0': 'pvtv2_b0',
         'flatten_swin_t': 'swin_t', 'flatten_cswin_t': 'swin_t', 'focal_t': 'swin_t',
         'l2vit_t': 'swin_t', 'care_s0': 'swin_t'}
# the backbones pretrain_study.py pretrains: its from-scratch arms are this table's runs, which
# the table trains first
PRETRAINED = ('flatten_pvt_t', 'lavit_t')
# backbones whose auxiliary loss the segmentor must add (LaViT's diagonality loss, sec. 3.4)
AUX_LOSS = {'lavit_t'}

# Sizes, from pilots on the 2-core machine, one thread per process (OMP_NUM_THREADS=1): at batch 4
# and 128x128 crops FLatten-PVT-T takes 0.8-0.9 CPU-s per iteration and Swin-T ~1.65, ~13 CPU-s
# for the 11 backbones together. From scratch, 80 iterations (at lr 2e-4, 1e-3 or 3e-3) and 240 at
# lr 1e-3 leave FLatten-PVT-T predicting background only (mIoU 17.55); 200 iterations at the
# demo's lr 2e-4 take it to 19.3 (evaluations at 50 / 100 / 150 / 200: 17.55, 17.55, 19.51,
# 19.30). At these sizes the 33 runs took 177 min of one core (measured: ~1 min of start-up and
# four evaluations per run included), ~1.5 h with two processes with disjoint --models (same
# --work-dir) on the two cores; --iters / --seeds scale it.
FULL = dict(iters=200, seeds=(0, 1, 2), evals=4, batch=4, crop=128, warmup=20, lr=2e-4)
QUICK = dict(iters=2, seeds=(0, ), evals=1, batch=2, crop=64, warmup=1, lr=2e-4)


def warmup_then(decay, warmup, iters):
    """Linear warm-up over ``warmup`` iterations (at most ``iters - 1``), then ``decay``."""
    warmup = max(1, min(warmup, iters - 1))
    schedule = [dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=warmup)]
    if warmup < iters:
        schedule.append(dict(decay, begin=warmup, end=iters))
    return schedule


def backbone_dict(spec):
    """A backbone dict for the segmentor: random initialisation (``init_cfg=None``)."""
    if isinstance(spec, tuple):
        from mmengine.config import Config
        _, path, key, overrides = spec
        cfg = Config.fromfile(osp.join(REPO, path), import_custom_modules=False)
        for part in key.split('.'):
            cfg = cfg[part]
        backbone = dict(cfg.to_dict(), **overrides)
    else:
        backbone = dict(spec)
    backbone.update(_delete_=True, init_cfg=None)
    return backbone


def run_overrides(name, sizes):
    """The config keys a table run sets on top of the segmentation demo config."""
    _, _, spec, channels = MODELS[name]
    iters, crop = sizes['iters'], sizes['crop']
    interval = max(1, iters // sizes['evals'])
    model = dict(backbone=backbone_dict(spec), neck=dict(in_channels=channels),
                 data_preprocessor=dict(size=(crop, crop)))
    if name in AUX_LOSS:
        model.update(type='AuxLossEncoderDecoder', with_backbone_aux_loss=True)
    return dict(
        model=model,
        optim_wrapper=dict(optimizer=dict(lr=sizes['lr'])),
        # crops of crop x crop from rescales around (crop * 5/4, crop), as the demo's 256 / 320
        train_dataloader=dict(
            batch_size=sizes['batch'],
            dataset=dict(pipeline=[
                dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations', reduce_zero_label=True),
                dict(type='RandomResize', scale=(crop * 5 // 4, crop), ratio_range=(0.75, 1.5),
                     keep_ratio=True),
                dict(type='RandomCrop', crop_size=(crop, crop), cat_max_ratio=0.9),
                dict(type='RandomFlip', prob=0.5),
                dict(type='PhotoMetricDistortion'),
                dict(type='PackSegInputs'),
            ])),
        val_dataloader=dict(dataset=dict(pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='Resize', scale=(crop * 5 // 4, crop), keep_ratio=True),
            dict(type='LoadAnnotations', reduce_zero_label=True),
            dict(type='PackSegInputs'),
        ])),
        train_cfg=dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=interval),
        param_scheduler=warmup_then(
            dict(type='PolyLR', power=0.9, eta_min=0.0, by_epoch=False), sizes['warmup'], iters),
        default_hooks=dict(logger=dict(interval=max(1, min(10, iters // 8))),
                           checkpoint=dict(by_epoch=False, interval=-1, save_last=False)),
    )


def run_text(name, seed, sizes):
    overrides = run_overrides(name, sizes)
    overrides['test_dataloader'] = overrides['val_dataloader']
    # the softmax peers are mmdet backbones: their registry must be filled
    extra = ('mmdet.models', ) if isinstance(MODELS[name][2], dict) else ()
    return config_text(SEG_DEMO, seed, overrides, extra_imports=extra)


def write_report(out, results, sizes, command, pngs, elapsed):
    lines = [
        '# Learning table: efficient attention vs softmax on the embedded shapes data',
        '',
        'Generated by `tools/analysis/learning_table.py`; regenerate with',
        '',
        f'    {command}',
        '',
        'Semantic FPN on the ADE20K-layout shapes data (5 classes, 64 training / 16 validation '
        'images, `python -m mmeffvit.datasets.shapes`), every backbone from scratch, the '
        f'segmentation demo\'s model and optimiser (`{SEG_DEMO}`: AdamW, weight decay '
        f'1e-4) with: lr {sizes["lr"]:g}, {sizes["iters"]} iterations of batch {sizes["batch"]}, '
        f'{sizes["crop"]}x{sizes["crop"]} crops, linear warm-up over {sizes["warmup"]} '
        f'iterations then poly decay, mIoU on the validation images every '
        f'{max(1, sizes["iters"] // sizes["evals"])} iterations; seeds '
        f'{", ".join(map(str, sizes["seeds"]))} (seeded, deterministic: the same command gives '
        'the same mIoU). mIoU: the last evaluation, mean ± std over the seeds. Cost: mean wall '
        'and CPU seconds (all threads) per training iteration and peak resident memory of the '
        'training process (framework included), mean over the seeds; wall time depends on the '
        f'machine\'s load. Training time of its runs, one process each: '
        f'{sum(r.get("wall_s", 0.0) for runs in results.values() for r in runs) / 60:.0f} min '
        f'in all (this invocation: {elapsed / 60:.0f} min; finished runs are reused).',
        '',
        'mIoU, first: at the first evaluation (how fast a backbone leaves the background-only '
        'prediction, mIoU 17.55); training loss: mean of the last five logged values (how well '
        'it fits). *vs peer*: the difference of the mean mIoU to the softmax backbone of mmdet '
        'of its width class (in the units of the larger of the two std) and the ratio of CPU '
        's/iter; a difference within one std is no evidence either way.',
        '',
        '| backbone | attention | mIoU (%) | mIoU, first | training loss | vs peer: ΔmIoU '
        '(std) / CPU× | s/iter (wall) | CPU s/iter | peak memory (MiB) |',
        '|---|---|---|---|---|---|---|---|---|',
    ]

    def stats(runs, key):
        return mean_std([key(r) for r in runs])

    for name, runs in results.items():
        label, attention = MODELS[name][:2]
        miou = fmt_mean_std([r['metrics']['mIoU'] for r in runs])
        first = fmt_mean_std([r['first_metrics']['mIoU'] for r in runs])
        loss = fmt_mean_std([r['last_loss'] for r in runs], 3)
        wall = stats(runs, lambda r: r['time'])[0]
        cpu = stats(runs, lambda r: r['cpu_time'])[0]
        peak = stats(runs, lambda r: r['peak_rss_mb'])[0]
        peer = PEERS.get(name)
        versus = '–'
        if peer in results:
            (m, sd), (pm, psd) = (stats(rs, lambda r: r['metrics']['mIoU'])
                                  for rs in (runs, results[peer]))
            spread = max(sd, psd)
            units = f' ({(m - pm) / spread:+.1f})' if spread > 0 else ''
            pcpu = stats(results[peer], lambda r: r['cpu_time'])[0]
            versus = f'{MODELS[peer][0].split()[0]}: {m - pm:+.1f}{units} / {cpu / pcpu:.2f}×'
        lines.append(f'| {label} | {attention} | {miou} | {first} | {loss} | {versus} | '
                     f'{wall:.2f} | {cpu:.2f} | {peak:.0f} |')
    lines += ['', 'Training curves (loss and mIoU vs iteration, seed '
              f'{sizes["seeds"][0]}):', '']
    lines += [f'![{osp.basename(p)}]({osp.basename(p)})' for p in pngs]
    with open(out, 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines) + '\n')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true',
                        help='tiny sizes (2 iterations, 1 seed, 64x64): checks that every '
                        'model trains; writes under work_dirs/learning_quick and does not '
                        'touch docs/ unless --out is given')
    parser.add_argument('--models', nargs='+', choices=list(MODELS), default=list(MODELS))
    parser.add_argument('--iters', type=int, help='training iterations per run')
    parser.add_argument('--seeds', type=int, nargs='+', help='seeds (default 0 1 2)')
    parser.add_argument('--crop', type=int, help='training crop side')
    parser.add_argument('--batch', type=int, help='training batch size')
    parser.add_argument('--lr', type=float, help='AdamW learning rate')
    parser.add_argument('--work-dir', help='where the runs go (default work_dirs/learning)')
    parser.add_argument('--out', help='the markdown table (default docs/learning.md)')
    parser.add_argument('--fresh', action='store_true', help='retrain finished runs')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress lines as they come, also into a file
    sizes = dict(QUICK if args.quick else FULL)
    for key in ('iters', 'crop', 'batch', 'lr'):
        if getattr(args, key):
            sizes[key] = getattr(args, key)
    if args.seeds:
        sizes['seeds'] = tuple(args.seeds)
    work_dir = args.work_dir or osp.join(
        REPO, 'work_dirs', 'learning_quick' if args.quick else 'learning')
    out = args.out or (osp.join(work_dir, 'learning.md') if args.quick
                       else osp.join(REPO, 'docs', 'learning.md'))
    command = 'python tools/analysis/learning_table.py' + (
        ' ' + ' '.join(argv if argv is not None else sys.argv[1:])
        if (argv if argv is not None else sys.argv[1:]) else '')
    # all layouts, as tools/demo.py and pretrain_study.py ask: the generator rewrites the folder
    # when the layouts differ from the last call's
    subprocess.run([sys.executable, '-m', 'mmeffvit.datasets.shapes', '--out', 'data/shapes'],
                   cwd=REPO, check=True, capture_output=True)
    start = time.time()
    results = {}
    try:
        for name in sorted(args.models, key=lambda n: n not in PRETRAINED):
            print(f'{MODELS[name][0]}:')
            results[name] = [
                train(osp.join(work_dir, f'{name}_seed{seed}'), run_text(name, seed, sizes),
                      fresh=args.fresh)
                for seed in sizes['seeds']]
    except StudyError as err:
        print(f'learning_table: {err}', file=sys.stderr)
        return 1
    elapsed = time.time() - start
    results = {name: results[name] for name in args.models}  # the table in the asked order
    seed = sizes['seeds'][0]
    stem = osp.splitext(out)[0]
    pngs = []
    # softmax peers beside their efficient counterparts, the rest together
    groups = [('pvt', ['flatten_pvt_t', 'pvt_t', 'flatten_pvtv2_b0', 'pvtv2_b0', 'lavit_t']),
              ('swin', ['flatten_swin_t', 'swin_t', 'flatten_cswin_t', 'focal_t', 'l2vit_t',
                        'care_s0'])]
    for group, names in groups:
        names = [n for n in names if n in results]
        if not names:
            continue
        png = f'{stem}_{group}.png'
        plot([osp.join(work_dir, f'{n}_seed{seed}') for n in names],
             [MODELS[n][0] for n in names], png, ['loss', 'mIoU'],
             f'Semantic FPN on shapes, seed {seed}')
        pngs.append(png)
    write_report(out, results, sizes, command, pngs, elapsed)
    print(f'table written to {out}; curves: {", ".join(pngs)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
