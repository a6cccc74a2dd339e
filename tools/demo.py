"""The main job on a fresh machine: train and evaluate FLatten-PVT-T on the embedded shapes data.

    python tools/demo.py                 # Mask R-CNN, 300 iterations on CPU, then COCO evaluation
    python tools/demo.py --task seg      # Semantic FPN, then mIoU
    python tools/demo.py --task both --iters 100

It generates the shapes dataset (deterministic, idempotent) under ``data/shapes``, runs the real
``tools/train.py`` and ``tools/test.py`` on the configs in ``configs/demo/``, prints the metrics and
saves pictures of the predictions. Training is seeded (``--seed``, default 0): on a CPU two runs
print the same metrics.
"""
import argparse
import glob
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TASKS = {
    'det': dict(config='configs/demo/mask_rcnn_flatten_pvt_t_1x_shapes.py',
                metrics=('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP',
                         'coco/segm_mAP_50')),
    'seg': dict(config='configs/demo/fpn_flatten_pvt_t_80k_shapes.py',
                metrics=('mIoU', 'mAcc', 'aAcc')),
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--task', choices=['det', 'seg', 'both'], default='det')
    parser.add_argument('--iters', type=int, default=300, help='training iterations')
    parser.add_argument('--data-root', default='data/shapes', help='where the shapes data goes')
    parser.add_argument('--work-dir', default='work_dirs/demo', help='outputs of the demo')
    parser.add_argument('--num-train', type=int, default=64)
    parser.add_argument('--num-val', type=int, default=16)
    parser.add_argument('--seed', type=int, default=0,
                        help='random seed of the training run (same seed, same metrics on CPU)')
    return parser.parse_args()


def run(cmd):
    print('+', ' '.join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def data_overrides(task, data_root):
    """--cfg-options pointing a demo config at ``data_root``."""
    if task == 'det':
        coco = osp.join(data_root, 'coco') + '/'
        ann = coco + 'annotations/instances_val2017.json'
        return [f'train_dataloader.dataset.data_root={coco}',
                f'val_dataloader.dataset.data_root={coco}',
                f'test_dataloader.dataset.data_root={coco}',
                f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}']
    ade = osp.join(data_root, 'ade', 'ADEChallengeData2016')
    return [f'{split}_dataloader.dataset.data_root={ade}' for split in ('train', 'val', 'test')]


def latest_metrics(work_dir):
    """Metrics mmengine's logger dumped for the newest test run in ``work_dir``."""
    logs = sorted(glob.glob(osp.join(work_dir, '2*', '2*.json')), key=osp.getmtime)
    if not logs:
        raise RuntimeError(f'no metrics log found in {work_dir}')
    with open(logs[-1]) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return records[-1], osp.dirname(logs[-1])


def run_task(task, args):
    spec = TASKS[task]
    work_dir = osp.join(args.work_dir, task)
    overrides = data_overrides(task, args.data_root) + [
        f'train_cfg.max_iters={args.iters}', f'train_cfg.val_interval={args.iters}',
        f'default_hooks.checkpoint.interval={args.iters}',
        # seeded and deterministic: two demo runs on a CPU print the same metrics
        f'randomness.seed={args.seed}', 'randomness.deterministic=True']
    start = time.time()
    run([sys.executable, 'tools/train.py', spec['config'], '--work-dir', work_dir,
         '--cfg-options'] + overrides)
    train_min = (time.time() - start) / 60
    ckpt = osp.join(work_dir, f'iter_{args.iters}.pth')
    run([sys.executable, 'tools/test.py', spec['config'], ckpt, '--work-dir', work_dir,
         '--show-dir', 'predictions', '--cfg-options'] + data_overrides(task, args.data_root))
    metrics, run_dir = latest_metrics(work_dir)
    curves = osp.join(work_dir, 'curves.png')  # losses and metrics vs iteration
    run([sys.executable, 'tools/analysis/plot_logs.py', work_dir, '--out', curves])
    # mmdet draws into <run_dir>/predictions, mmseg into <work_dir>/predictions/vis_data
    pictures = sorted(p for base in (run_dir, work_dir)
                      for p in glob.glob(osp.join(base, 'predictions', '**', '*.*'),
                                         recursive=True)
                      if p.lower().endswith(('.jpg', '.jpeg', '.png')))
    summary = {k: metrics.get(k) for k in spec['metrics']}
    picture = None
    if pictures:
        picture = osp.join(work_dir, 'predictions' + osp.splitext(pictures[0])[1])
        shutil.copyfile(pictures[0], picture)
    return dict(task=task, train_minutes=round(train_min, 1), metrics=summary,
                predictions_dir=osp.dirname(pictures[0]) if pictures else None,
                example=picture, curves=curves)


def main():
    args = parse_args()
    os.chdir(ROOT)
    sys.path.insert(0, ROOT)
    from mmeffvit.datasets import generate_shapes
    info = generate_shapes(args.data_root, num_train=args.num_train, num_val=args.num_val)
    print(f"shapes data in {args.data_root}: {info['num_train']} train / {info['num_val']} val "
          'images', flush=True)
    tasks = ['det', 'seg'] if args.task == 'both' else [args.task]
    results = [run_task(t, args) for t in tasks]
    print('\n==== mmeffvit demo: FLatten-PVT-T on the shapes data ====')
    for res in results:
        print(f"[{res['task']}] trained {args.iters} iterations in {res['train_minutes']} min")
        for key, value in res['metrics'].items():
            print(f'  {key}: {value}')
        print(f"  predictions drawn in {res['predictions_dir']}; example: {res['example']}")
        print(f"  training curves: {res['curves']}")
    with open(osp.join(args.work_dir, 'summary.json'), 'w') as f:
        json.dump(results, f, indent=2)


if __name__ == '__main__':
    main()
