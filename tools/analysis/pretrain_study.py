"""Does classification pretraining help the dense tasks? ``docs/pretraining.md``.

On the embedded shapes data, seeded and reproducible (the same command gives the same numbers):

1. pretrain FLatten-PVT-T and LaViT-T as classifiers (mmpretrain ``ImageClassifier``, the
   configs/demo/cls_<backbone>_300e_shapes.py configs: 8 shape classes, 64x64 crops) with
   ``tools/train.py``, seed 0;
2. fine-tune Semantic FPN on the ADE20K-layout shapes data from that checkpoint, loaded by the
   dense config's own mechanism, ``model.backbone.init_cfg=dict(type='Pretrained',
   checkpoint=<cls checkpoint>, prefix='backbone.')``, and from scratch, with the same iterations,
   schedule and seeds (the learning table's segmentation runs: learning_table.py), over 3 seeds:
   mIoU mean ± std;
3. the same for Mask R-CNN with FLatten-PVT-T on the COCO-layout shapes data
   (configs/demo/mask_rcnn_flatten_pvt_t_1x_shapes.py): bbox / segm mAP.

Every fine-tuning run from a checkpoint checks in its log that the backbone loaded it (a missing
file would only be a warning in the backbone). Curves go to docs/pretraining_*.png.

    # docs/pretraining.md: FLatten-PVT-T alone about an hour, both ~80 min two runs at a time
    python tools/analysis/pretrain_study.py --backbones flatten_pvt_t
    python tools/analysis/pretrain_study.py
    python tools/analysis/pretrain_study.py --quick   # every stage with tiny sizes (minutes)

Finished runs are reused when the command is repeated (``--fresh`` trains everything again).
"""
import argparse
import os.path as osp
import subprocess
import sys
import time

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from learning_table import MODELS as SEG_MODELS  # noqa: E402
from learning_table import FULL as LT_FULL  # noqa: E402
from learning_table import QUICK as LT_QUICK  # noqa: E402
from learning_table import PRETRAINED, SEG_DEMO, run_overrides, warmup_then  # noqa: E402
from study_runs import (REPO, StudyError, config_text, fmt_mean_std, last_checkpoint,  # noqa
                        mean_std, plot, train)

BACKBONES = {name: f'configs/demo/cls_{name}_300e_shapes.py' for name in PRETRAINED}
DET_DEMO = 'configs/demo/mask_rcnn_flatten_pvt_t_1x_shapes.py'
DET_BACKBONE = 'flatten_pvt_t'


def _seg_sizes(sizes):
    """The learning table's Semantic FPN sizes (the seeds are the study's own)."""
    return {k: v for k, v in sizes.items() if k != 'seeds'}


# Sizes. On this data nothing learns fast from scratch (pilots, one thread each, 2-core CPU):
# * the FLatten-PVT-T classifier at batch 32 (0.80 CPU-s/iter) at lr 1e-3 (the demos' former
#   lr) learns only once the cosine has taken the lr below ~3e-4: over 1000 iterations top-1 is
#   12.8 / 13.8 / 16.3 / 17.5 % after 250 / 500 / 750 / 1000; over 3000 it is 13.8 % after 750
#   and 12.2 % after 1500 (lr still 5.5e-4). Hence lr 3e-4 here. A ResNet-18 in the same
#   pipeline is still at chance after 300 iterations of batch 16. LaViT-T cost 2.3-2.9
#   CPU-s/iter there while its windows were those of a 224 grid (a 64² input padded into them,
#   5x the MACs); at its own 64 grid 0.68;
# * Semantic FPN (the learning table's sizes, learning_table.py): from scratch FLatten-PVT-T
#   leaves the background (mIoU 17.55) after 150 of the 200 iterations (19.3 at the end); from
#   the 1000-iteration classifier it ends at 18.8;
# * Mask R-CNN, batch 2 at 320 px: 6.9 CPU-s/iter.
# FLatten-PVT-T alone (--backbones flatten_pvt_t): pretraining 2000 iterations (~28 CPU-min),
# 2 x 3 Semantic FPN runs of 200 iterations (~4.5 CPU-min each; the 3 from scratch are the
# learning table's) and 2 Mask R-CNN runs of 150 iterations (~18 CPU-min each): ~90 CPU-min,
# about an hour of wall time with two threads. LaViT-T adds ~40 CPU-min (pretraining ~23, six
# Semantic FPN runs ~4 each, three of them the learning table's). Measured for both backbones:
# 156 min of single-thread runs, ~80 min of wall time two at a time (docs/pretraining.md).
FULL = dict(cls_iters=2000, cls_batch=32, cls_lr=3e-4, seg=_seg_sizes(LT_FULL), seeds=(0, 1, 2),
            det_iters=150, det_seeds=(0, ))
QUICK = dict(cls_iters=2, cls_batch=8, cls_lr=3e-4, seg=_seg_sizes(LT_QUICK), seeds=(0, ),
             det_iters=2, det_seeds=(0, ))


def cls_text(backbone, sizes):
    iters = sizes['cls_iters']
    return config_text(BACKBONES[backbone], 0, dict(
        train_dataloader=dict(batch_size=sizes['cls_batch']),
        optim_wrapper=dict(optimizer=dict(lr=sizes['cls_lr'])),
        # four evaluations of the 320 validation images (seconds each): a top-1 curve
        train_cfg=dict(max_iters=iters, val_interval=max(1, iters // 4)),
        param_scheduler=warmup_then(
            dict(type='CosineAnnealingLR', eta_min_ratio=0.01, by_epoch=False), iters // 10,
            iters),
        default_hooks=dict(logger=dict(interval=max(1, min(20, iters // 10))),
                           checkpoint=dict(by_epoch=False, interval=iters, max_keep_ckpts=1,
                                           save_best=None))))


def pretrained_init(checkpoint):
    return dict(type='Pretrained', checkpoint=checkpoint, prefix='backbone.')


def seg_text(backbone, seed, sizes, checkpoint=None):
    overrides = run_overrides(backbone, sizes['seg'])
    overrides['test_dataloader'] = overrides['val_dataloader']
    if checkpoint:
        overrides['model']['backbone']['init_cfg'] = pretrained_init(checkpoint)
    return config_text(SEG_DEMO, seed, overrides)


def det_text(seed, sizes, checkpoint=None):
    iters = sizes['det_iters']
    warmup = max(1, iters // 6)
    overrides = dict(
        train_cfg=dict(max_iters=iters, val_interval=iters),
        param_scheduler=[
            dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=warmup),
            dict(type='MultiStepLR', by_epoch=False, begin=0, end=iters,
                 milestones=[max(1, int(iters * 0.75))], gamma=0.1),
        ],
        default_hooks=dict(logger=dict(interval=max(1, min(10, iters // 6))),
                           checkpoint=dict(by_epoch=False, interval=-1, save_last=False)))
    if checkpoint:
        # _delete_: the demo config's init_cfg is None, which a dict cannot merge into
        init_cfg = dict(_delete_=True, **pretrained_init(checkpoint))
        overrides['model'] = dict(backbone=dict(init_cfg=init_cfg))
    return config_text(DET_DEMO, seed, overrides)


def scratch_dir(work_dir, name, seed, args):
    """Where a from-scratch Semantic FPN run goes: when the study's sizes are the learning
    table's, the learning table's run of the same config (learning_table.py trains these first),
    so neither study trains it twice; the config digest decides whether a run can be reused."""
    if args.quick or args.work_dir or _seg_sizes(LT_FULL) != FULL['seg']:
        return osp.join(work_dir, f'fpn_{name}_scratch_seed{seed}')
    return osp.join(REPO, 'work_dirs', 'learning', f'{name}_seed{seed}')


def check_loaded(work_dir, checkpoint):
    """Fail unless the run's log says the backbone loaded ``checkpoint``."""
    with open(osp.join(work_dir, 'train.log'), encoding='utf-8', errors='replace') as f:
        text = f.read()
    if f'from {checkpoint}' not in text or 'not found' in text.split(checkpoint)[1][:60]:
        raise StudyError(f'{work_dir}: the backbone did not report loading {checkpoint}')


def run_minutes(cls, seg, det):
    """Wall minutes the study's runs took when they were trained (``wall_s`` of each summary)."""
    runs = list(cls.values()) + [r for arms in seg.values() for arm in arms for r in arm]
    runs += [r for arm in (det or ()) for r in arm]
    return sum(r.get('wall_s', 0.0) for r in runs) / 60


def write_report(out, sizes, command, cls, seg, det, pngs, elapsed):
    seg_sizes = sizes['seg']
    seeds = ', '.join(map(str, sizes['seeds']))
    lines = [
        '# Pretraining on the shapes classification data, then fine-tuning', '',
        'Generated by `tools/analysis/pretrain_study.py`; regenerate with', '',
        f'    {command}', '',
        'Every run is seeded with `randomness.deterministic=True`: on a CPU the same command '
        f'gives the same numbers. Training time of its runs, one process each: '
        f'{run_minutes(cls, seg, det):.0f} min in all (this invocation: {elapsed / 60:.0f} min; '
        'finished runs are reused).', '',
        '## Sizes', '',
        f'* pretraining: the `configs/demo/cls_*_300e_shapes.py` classifiers (8 classes, '
        f'160 / 40 images per class of 64-96 px, 64x64 crops, no Mixup / CutMix / RandAugment), '
        f'{sizes["cls_iters"]} iterations of batch {sizes["cls_batch"]}, AdamW lr '
        f'{sizes["cls_lr"]:g} (linear warm-up over the first tenth, then cosine), seed 0;',
        f'* Semantic FPN (ADE20K-layout shapes: 5 classes, 64 / 16 images): the segmentation '
        f'demo\'s model and optimiser (AdamW, lr {seg_sizes["lr"]:g}), {seg_sizes["iters"]} '
        f'iterations of batch {seg_sizes["batch"]}, {seg_sizes["crop"]}x{seg_sizes["crop"]} '
        f'crops, linear warm-up over {seg_sizes["warmup"]} iterations then poly decay, seeds '
        f'{seeds}; the backbone from the classifier '
        "(`init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')`) or random;",
        (f'* Mask R-CNN (COCO-layout shapes, 4 classes, 320 px): `{DET_DEMO}` cut to '
         f'{sizes["det_iters"]} iterations, seeds {", ".join(map(str, sizes["det_seeds"]))}.'
         if det else '* Mask R-CNN: not run (--no-det).'), '',
    ]
    left = [SEG_MODELS[n][0] for n in BACKBONES if n not in cls]
    if left:
        lines += [f'Not in this run: {", ".join(left)} (`--backbones` adds them; see the sizes '
                  'and costs in the script).', '']
    lines += [
        '## Pretraining', '',
        '| backbone | top-1 (%) | top-5 (%) | s/iter (wall) | CPU s/iter |',
        '|---|---|---|---|---|',
    ]
    for name, summary in cls.items():
        m = summary['metrics']
        lines.append(f'| {SEG_MODELS[name][0]} | {m["accuracy/top1"]:.1f} | '
                     f'{m["accuracy/top5"]:.1f} | {summary["time"]:.2f} | '
                     f'{summary["cpu_time"]:.2f} |')
    lines += ['', '## Semantic FPN, mean ± std over the seeds', '',
              'mIoU (%) at the last and at the first evaluation, and the training loss (mean of '
              'the last five logged values). Predicting background everywhere scores mIoU 17.55.',
              '', '| backbone | init | mIoU, last | mIoU, first | training loss, last | '
              'CPU s/iter |', '|---|---|---|---|---|---|']
    for name, arms in seg.items():
        for arm, runs in zip(('from scratch', 'pretrained on shapes'), arms):
            first = runs[0]['first_val_iter']
            lines.append(
                f'| {SEG_MODELS[name][0]} | {arm} | '
                f'{fmt_mean_std([r["metrics"]["mIoU"] for r in runs])} | '
                f'{fmt_mean_std([r["first_metrics"]["mIoU"] for r in runs])} (iter {first}) '
                f'| {fmt_mean_std([r["last_loss"] for r in runs], 3)} | '
                f'{mean_std([r["cpu_time"] for r in runs])[0]:.2f} |')
    if det:
        lines += ['', f'## Mask R-CNN, {SEG_MODELS[DET_BACKBONE][0]} (mAP)', '',
                  '| init | bbox mAP | segm mAP |', '|---|---|---|']
        for arm, runs in zip(('from scratch', 'pretrained on shapes'), det):
            lines.append(f'| {arm} | '
                         f'{fmt_mean_std([r["metrics"]["coco/bbox_mAP"] for r in runs], 3)} | '
                         f'{fmt_mean_std([r["metrics"]["coco/segm_mAP"] for r in runs], 3)} |')
    lines += ['', '## Curves', '']
    lines += [f'![{osp.basename(p)}]({osp.basename(p)})' for p in pngs]
    with open(out, 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines) + '\n')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true',
                        help='tiny sizes (2 iterations per run, one seed): checks every stage; '
                        'writes under work_dirs/pretrain_quick, not docs/')
    parser.add_argument('--backbones', nargs='+', choices=list(BACKBONES),
                        default=list(BACKBONES))
    parser.add_argument('--no-det', action='store_true', help='skip the Mask R-CNN stage')
    parser.add_argument('--work-dir', help='where the runs go (default work_dirs/pretrain)')
    parser.add_argument('--out', help='the report (default docs/pretraining.md)')
    parser.add_argument('--fresh', action='store_true', help='retrain finished runs')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress lines as they come, also into a file
    sizes = QUICK if args.quick else FULL
    work_dir = args.work_dir or osp.join(
        REPO, 'work_dirs', 'pretrain_quick' if args.quick else 'pretrain')
    out = args.out or (osp.join(work_dir, 'pretraining.md') if args.quick
                       else osp.join(REPO, 'docs', 'pretraining.md'))
    given = argv if argv is not None else sys.argv[1:]
    command = ' '.join(['python tools/analysis/pretrain_study.py', *given])
    subprocess.run([sys.executable, '-m', 'mmeffvit.datasets.shapes', '--out', 'data/shapes'],
                   cwd=REPO, check=True, capture_output=True)
    start = time.time()
    cls, seg, det = {}, {}, None
    try:
        for name in args.backbones:
            print(f'pretraining {name}:')
            cls_dir = osp.join(work_dir, f'cls_{name}')
            cls[name] = train(cls_dir, cls_text(name, sizes), fresh=args.fresh)
            ckpt = last_checkpoint(cls_dir)
            print(f'Semantic FPN {name}, from scratch / pretrained:')
            arms = ([], [])
            for seed in sizes['seeds']:
                scratch = scratch_dir(work_dir, name, seed, args)
                arms[0].append(train(scratch, seg_text(name, seed, sizes), fresh=args.fresh))
                run_dir = osp.join(work_dir, f'fpn_{name}_pretrained_seed{seed}')
                arms[1].append(train(run_dir, seg_text(name, seed, sizes, ckpt),
                                     fresh=args.fresh))
                check_loaded(run_dir, ckpt)
            seg[name] = arms
        if not args.no_det and DET_BACKBONE in cls:
            print(f'Mask R-CNN {DET_BACKBONE}, from scratch / pretrained:')
            ckpt = last_checkpoint(osp.join(work_dir, f'cls_{DET_BACKBONE}'))
            det = ([], [])
            for seed in sizes['det_seeds']:
                det[0].append(train(osp.join(work_dir, f'mask_rcnn_scratch_seed{seed}'),
                                    det_text(seed, sizes), fresh=args.fresh))
                run_dir = osp.join(work_dir, f'mask_rcnn_pretrained_seed{seed}')
                det[1].append(train(run_dir, det_text(seed, sizes, ckpt), fresh=args.fresh))
                check_loaded(run_dir, ckpt)
    except StudyError as err:
        print(f'pretrain_study: {err}', file=sys.stderr)
        return 1
    elapsed = time.time() - start
    stem = osp.splitext(out)[0]
    pngs = []
    try:
        png = f'{stem}_cls.png'
        plot([osp.join(work_dir, f'cls_{n}') for n in cls], [SEG_MODELS[n][0] for n in cls],
             png, ['loss', 'accuracy/top1'], 'Pretraining on shapes classification')
        pngs.append(png)
        seed = sizes['seeds'][0]
        for name in seg:
            png = f'{stem}_fpn_{name}.png'
            plot([scratch_dir(work_dir, name, seed, args),
                  osp.join(work_dir, f'fpn_{name}_pretrained_seed{seed}')],
                 ['from scratch', 'pretrained'], png, ['loss', 'mIoU'],
                 f'Semantic FPN, {SEG_MODELS[name][0]}, seed {seed}')
            pngs.append(png)
    except StudyError as err:
        print(f'pretrain_study: {err}', file=sys.stderr)
        return 1
    write_report(out, sizes, command, cls, seg, det, pngs, elapsed)
    print(f'report written to {out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
