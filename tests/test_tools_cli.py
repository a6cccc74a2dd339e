"""Fast tests of tools/train.py, tools/test.py and mmeffvit.engine.launch.

Nothing here trains a real model; the distributed tests only prove that the
CPU (gloo) launch path works, using a two-iteration toy model.
"""
import importlib.util
import json
import os
import os.path as osp
import pickle
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.config import Config

from mmeffvit.engine import launch

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _load_tool(name):
    """Import tools/<name>.py, which is a script rather than a module."""
    path = osp.join(REPO_ROOT, 'tools', f'{name}.py')
    spec = importlib.util.spec_from_file_location(f'_tool_{name}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_tool = _load_tool('train')
test_tool = _load_tool('test')


@pytest.fixture(autouse=True)
def _keep_local_rank():
    """parse_args exports LOCAL_RANK; keep it from leaking into other tests."""
    saved = os.environ.get('LOCAL_RANK')
    yield
    if saved is None:
        os.environ.pop('LOCAL_RANK', None)
    else:
        os.environ['LOCAL_RANK'] = saved


def _free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _write(path, text):
    path.write_text(textwrap.dedent(text))
    return str(path)


# A minimal mmdet-like / mmseg-like config: just the parts the tools edit.
def _toolbox_cfg(scope):
    hook = dict(mmdet='DetVisualizationHook', mmseg='SegVisualizationHook',
                mmpretrain='VisualizationHook')[scope]
    metric = dict(mmdet=dict(type='CocoMetric', metric='bbox'),
                  mmseg=dict(type='IoUMetric', iou_metrics=['mIoU']),
                  mmpretrain=dict(type='Accuracy'))[scope]
    return Config(dict(
        default_scope=scope,
        model=dict(type='Net'),
        default_hooks=dict(visualization=dict(type=hook)),
        visualizer=dict(type='Visualizer', name='visualizer'),
        test_dataloader=dict(dataset=dict(type='RepeatDataset', dataset=dict(
            type='Data', pipeline=[
                dict(type='LoadImageFromFile'),
                dict(type='PackInputs', meta_keys=('img_id', 'scale_factor'))
            ]))),
        test_evaluator=metric))


# --- argument parsing -------------------------------------------------------

@pytest.mark.parametrize('argv, expected', [
    ([], None),
    (['--resume'], 'auto'),
    (['--resume', 'ckpt/epoch_3.pth'], 'ckpt/epoch_3.pth'),
])
def test_resume_argument(argv, expected):
    assert train_tool.parse_args(['cfg.py'] + argv).resume == expected


def test_train_defaults_and_cfg_options():
    args = train_tool.parse_args(
        ['cfg.py', '--cfg-options', 'a.b=1', 'c=[1,2]', 'd=x'])
    assert args.cfg_options == {'a.b': 1, 'c': [1, 2], 'd': 'x'}
    assert args.launcher == 'none' and not args.amp and not args.auto_scale_lr
    assert args.work_dir is None


def test_test_arguments():
    args = test_tool.parse_args(['cfg.py', 'w.pth', '--out', 'r.pkl',
                                 '--show-dir', 'vis', '--tta'])
    assert (args.config, args.checkpoint, args.out) == ('cfg.py', 'w.pth',
                                                        'r.pkl')
    assert args.show_dir == 'vis' and args.tta and args.wait_time == 2
    with pytest.raises(SystemExit):
        test_tool.parse_args(['cfg.py'])  # the checkpoint is required


@pytest.mark.parametrize('flag', ['--local_rank', '--local-rank'])
def test_local_rank_sets_env(monkeypatch, flag):
    monkeypatch.delenv('LOCAL_RANK', raising=False)
    assert train_tool.parse_args(['cfg.py', flag, '3']).local_rank == 3
    assert os.environ['LOCAL_RANK'] == '3'
    # A launcher-provided value wins over the flag.
    monkeypatch.setenv('LOCAL_RANK', '1')
    test_tool.parse_args(['cfg.py', 'w.pth', flag, '5'])
    assert os.environ['LOCAL_RANK'] == '1'


# --- config edits -----------------------------------------------------------

def test_work_dir_priority(tmp_path):
    cfg = Config(dict(work_dir='from_cfg'))
    assert launch.resolve_work_dir(cfg, 'from_cli', 'a/b.py') == 'from_cli'
    cfg = Config(dict(work_dir='from_cfg'))
    assert launch.resolve_work_dir(cfg, None, 'a/b.py') == 'from_cfg'
    cfg = Config(dict())
    assert launch.resolve_work_dir(cfg, None, 'a/my_exp.py') == osp.join(
        './work_dirs', 'my_exp')
    # Through the whole loader, with --cfg-options applied first.
    path = _write(tmp_path / 'exp.py', "work_dir = 'cfg_dir'\nx = 1\n")
    args = train_tool.parse_args([path, '--cfg-options', 'x=2'])
    cfg = launch.load_config(args)
    assert (cfg.work_dir, cfg.x, cfg.launcher) == ('cfg_dir', 2, 'none')


@pytest.mark.parametrize('argv, resume, load_from', [
    ([], False, 'init.pth'),
    (['--resume'], True, 'WORK/iter_8.pth'),  # the newest intact checkpoint of the work dir
    (['--resume', 'WORK/iter_4.pth'], True, 'WORK/iter_4.pth'),
])
def test_resume_cfg_fields(tmp_path, argv, resume, load_from):
    for step in (4, 8):
        torch.save(dict(step=step), str(tmp_path / f'iter_{step}.pth'))
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_8.pth'))
    cfg = Config(dict(resume=False, load_from='init.pth', work_dir=str(tmp_path),
                      optim_wrapper=dict(type='OptimWrapper')))
    argv = [a.replace('WORK', str(tmp_path)) for a in argv]
    launch.apply_train_args(cfg, train_tool.parse_args(['c.py'] + argv))
    assert (cfg.resume, cfg.load_from) == (resume, load_from.replace('WORK', str(tmp_path)))
    assert [h['type'] for h in cfg.custom_hooks] == ['ResumeStateHook', 'NonFiniteLossHook']


def test_amp_needs_gpu(tmp_path, monkeypatch, capsys):
    path = _write(tmp_path / 'amp.py',
                  "optim_wrapper = dict(type='OptimWrapper')\n")
    if torch.cuda.is_available():
        monkeypatch.setattr(launch, 'amp_device_available', lambda: False)
    with pytest.raises(SystemExit) as exc:
        train_tool.main([path, '--amp'])
    assert exc.value.code == 2
    assert '--amp needs a GPU' in capsys.readouterr().err
    # Where AMP can run, the optimizer wrapper is switched.
    monkeypatch.setattr(launch, 'amp_device_available', lambda: True)
    cfg = launch.apply_train_args(Config.fromfile(path),
                                  train_tool.parse_args([path, '--amp']))
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.loss_scale == 'dynamic'


def test_mmdet2_fp16_key_is_an_error_that_names_amp(tmp_path, capsys):
    path = _write(tmp_path / 'fp16.py', "optim_wrapper = dict(type='OptimWrapper')\n"
                  "fp16 = dict(loss_scale=512.)\n")
    with pytest.raises(SystemExit) as exc:
        train_tool.main([path])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert 'fp16=' in err and '--amp' in err and 'AmpOptimWrapper' in err


def test_auto_scale_lr(tmp_path, capsys):
    path = _write(tmp_path / 'plain.py',
                  "optim_wrapper = dict(type='OptimWrapper')\n")
    with pytest.raises(SystemExit):
        train_tool.main([path, '--auto-scale-lr'])
    assert 'auto_scale_lr' in capsys.readouterr().err
    cfg = Config(dict(auto_scale_lr=dict(enable=False, base_batch_size=16)))
    launch.apply_train_args(
        cfg, train_tool.parse_args(['c.py', '--auto-scale-lr']))
    assert cfg.auto_scale_lr.enable is True


def test_mmdet_out_and_show_dir():
    cfg = _toolbox_cfg('mmdet')
    args = test_tool.parse_args(['c.py', 'w.pth', '--out', 'res.pkl',
                                 '--show-dir', 'vis', '--show'])
    launch.apply_test_args(cfg, args)
    assert cfg.load_from == 'w.pth'
    assert [m.type for m in cfg.test_evaluator] == ['CocoMetric',
                                                    'DumpDetResults']
    assert cfg.test_evaluator[1].out_file_path == 'res.pkl'
    hook = cfg.default_hooks.visualization
    assert (hook.draw, hook.test_out_dir, hook.show) == (True, 'vis', True)
    assert hook.wait_time == 2
    with pytest.raises(launch.ConfigError, match='.pkl'):
        launch.apply_test_args(_toolbox_cfg('mmdet'), test_tool.parse_args(
            ['c.py', 'w.pth', '--out', 'res.json']))


def test_mmseg_out_and_show_dir():
    cfg = _toolbox_cfg('mmseg')
    cfg.work_dir = 'wd'
    args = test_tool.parse_args(['c.py', 'w.pth', '--out', 'pred_dir',
                                 '--show-dir', 'vis'])
    launch.apply_test_args(cfg, args)
    assert cfg.test_evaluator.type == 'IoUMetric'
    assert cfg.test_evaluator.output_dir == 'pred_dir'
    assert cfg.test_evaluator.keep_results is True
    assert cfg.default_hooks.visualization.draw is True
    assert 'test_out_dir' not in cfg.default_hooks.visualization
    assert cfg.visualizer.save_dir == 'wd/vis'  # under the work dir, not the current dir
    assert cfg.default_hooks.visualization.interval == 1  # every image drawn


def test_mmpretrain_out_and_show_dir():
    cfg = _toolbox_cfg('mmpretrain')
    launch.apply_test_args(cfg, test_tool.parse_args(
        ['c.py', 'w.pth', '--out', 'r.pickle', '--show-dir', 'vis']))
    assert cfg.test_evaluator[1] == dict(type='DumpResults',
                                         out_file_path='r.pickle')
    hook = cfg.default_hooks.visualization
    assert (hook.enable, hook.out_dir) == (True, 'vis')


def test_show_needs_visualization_hook():
    cfg = _toolbox_cfg('mmdet')
    cfg.default_hooks = dict(logger=dict(type='LoggerHook'))
    with pytest.raises(launch.ConfigError, match='visualization'):
        launch.apply_test_args(cfg, test_tool.parse_args(
            ['c.py', 'w.pth', '--show']))


def test_tta():
    cfg = _toolbox_cfg('mmdet')
    launch.apply_test_args(cfg, test_tool.parse_args(['c', 'w', '--tta']))
    assert cfg.model.type == 'DetTTAModel' and cfg.model.module.type == 'Net'
    assert cfg.model.tta_cfg.nms.iou_threshold == 0.5
    pipeline = cfg.test_dataloader.dataset.dataset.pipeline
    assert pipeline[0].type == 'LoadImageFromFile'
    flips, (packer, ) = pipeline[-1].transforms
    assert sorted(f.prob for f in flips) == [0., 1.]
    assert {'flip', 'flip_direction'} <= set(packer.meta_keys)
    # mmseg has no default TTA pipeline: the config must provide one.
    cfg = _toolbox_cfg('mmseg')
    with pytest.raises(launch.ConfigError, match='tta_pipeline'):
        launch.apply_test_args(cfg, test_tool.parse_args(['c', 'w', '--tta']))
    cfg.tta_model = dict(type='SegTTAModel')
    cfg.tta_pipeline = [dict(type='LoadImageFromFile'),
                        dict(type='TestTimeAug', transforms=[])]
    launch.apply_test_args(cfg, test_tool.parse_args(['c', 'w', '--tta']))
    assert cfg.model.type == 'SegTTAModel' and cfg.model.module.type == 'Net'
    assert cfg.test_dataloader.dataset.dataset.pipeline[-1].type == (
        'TestTimeAug')


REAL_BASES = dict(
    mmdet=['default_runtime.py', 'datasets/coco_detection.py'],
    mmseg=['default_runtime.py', 'schedules/schedule_20k.py',
           'datasets/ade20k.py'])


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_real_base_configs(tmp_path, scope):
    """The toolboxes' own base configs accept --out, --show-dir and --tta."""
    pytest.importorskip(scope)
    bases = [f'{scope}::_base_/{name}' for name in REAL_BASES[scope]]
    path = _write(tmp_path / f'{scope}_base.py',
                  f"_base_ = {bases!r}\nmodel = dict(type='Net')\n")
    out = 'r.pkl' if scope == 'mmdet' else 'pred_dir'
    cfg = launch.apply_test_args(Config.fromfile(path), test_tool.parse_args(
        [path, 'w.pth', '--show-dir', 'vis', '--out', out, '--tta']))
    assert launch.get_scope(cfg) == scope
    assert cfg.default_hooks.visualization.draw is True
    assert cfg.model.module.type == 'Net'
    pipeline = cfg.test_dataloader.dataset.pipeline
    assert pipeline[-1].type == 'TestTimeAug'
    if scope == 'mmdet':
        assert cfg.default_hooks.visualization.test_out_dir == 'vis'
        assert cfg.test_evaluator[-1].type == 'DumpDetResults'
        assert cfg.model.type == 'DetTTAModel'
        assert 'flip' in pipeline[-1].transforms[-1][0].meta_keys
    else:
        assert cfg.visualizer.save_dir == 'vis'
        assert cfg.test_evaluator.output_dir == 'pred_dir'
        assert cfg.model.type == 'SegTTAModel'


# --- CPU distributed --------------------------------------------------------

def test_cpu_setup_is_noop_without_launcher():
    cfg = Config(dict(env_cfg=dict(dist_cfg=dict(backend='nccl'))))
    assert launch.setup_cpu_distributed(cfg, 'none') is False
    assert cfg.env_cfg.dist_cfg.backend == 'nccl'
    assert 'model_wrapper_cfg' not in cfg


def _dist_worker(rank, world_size, ports, out_dir):
    env = os.environ
    env.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(ports[0]),
               RANK=str(rank), WORLD_SIZE=str(world_size),
               LOCAL_RANK=str(rank))
    cfg = Config(dict(env_cfg=dict(dist_cfg=dict(backend='nccl'))))
    applied = launch.setup_cpu_distributed(cfg, 'pytorch')
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value)
    result = dict(applied=applied, backend=dist.get_backend(),
                  sum=value.item(), cfg_backend=cfg.env_cfg.dist_cfg.backend,
                  wrapper=cfg.model_wrapper_cfg.to_dict())
    dist.destroy_process_group()
    # Same again as Slurm would start it: only SLURM_* variables are set.
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'):
        del env[key]
    env.update(SLURM_PROCID=str(rank), SLURM_NTASKS=str(world_size),
               SLURM_LOCALID=str(rank), SLURM_NODELIST='localhost',
               MASTER_PORT=str(ports[1]))
    launch.init_cpu_process_group('slurm')
    value = torch.tensor([10.0])
    dist.all_reduce(value)
    result.update(slurm_sum=value.item(), slurm_rank=dist.get_rank(),
                  slurm_env_rank=env['RANK'])
    dist.destroy_process_group()
    with open(osp.join(out_dir, f'rank{rank}.json'), 'w') as f:
        json.dump(result, f)


def test_cpu_distributed_init(tmp_path, monkeypatch):
    # Hide any GPU so the CPU path is exercised on every machine.
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    ports = (_free_port(), _free_port())
    mp.spawn(_dist_worker, args=(2, ports, str(tmp_path)), nprocs=2)
    for rank in range(2):
        res = json.loads((tmp_path / f'rank{rank}.json').read_text())
        assert res['applied'] is True
        assert res['backend'] == 'gloo' and res['cfg_backend'] == 'gloo'
        assert res['sum'] == 3.0
        assert res['wrapper'] == dict(  # the CPU variant converts SyncBN
            type='CPUSyncBNMMDistributedDataParallel', broadcast_buffers=False,
            find_unused_parameters=False, device_ids=None)
        assert res['slurm_sum'] == 20.0
        assert res['slurm_rank'] == rank and res['slurm_env_rank'] == str(
            rank)


TOY_MODULE = '''
import os

import torch
import torch.distributed as dist
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, MODELS
from torch.utils.data import Dataset


@MODELS.register_module()
class CliToyModel(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, inputs, labels=None, mode='tensor'):
        pred = self.linear(inputs).squeeze(-1)
        if mode != 'loss':
            return pred
        if dist.is_initialized():  # leave evidence of the process group
            rank = dist.get_rank()
            with open(os.path.join(os.environ['TOY_MARKER_DIR'],
                                   f'rank{rank}.txt'), 'w') as f:
                f.write(f'{dist.get_backend()} {dist.get_world_size()}')
        return dict(loss=((pred - labels) ** 2).mean())


@DATASETS.register_module()
class CliToyDataset(Dataset):

    def __len__(self):
        return 8

    def __getitem__(self, index):
        x = torch.full((2, ), float(index))
        return dict(inputs=x, labels=x.sum())
'''

TOY_CONFIG = '''
default_scope = 'mmengine'
custom_imports = dict(imports=['cli_toy_model'], allow_failed_imports=False)
model = dict(type='CliToyModel')
train_dataloader = dict(
    batch_size=2, num_workers=0, dataset=dict(type='CliToyDataset'),
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'))
train_cfg = dict(type='IterBasedTrainLoop', max_iters=2)
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
default_hooks = dict(
    checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
    logger=dict(type='LoggerHook', interval=1))
test_dataloader = dict(
    batch_size=2, num_workers=0, dataset=dict(type='CliToyDataset'),
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'))
test_cfg = dict(type='TestLoop')
test_evaluator = []  # tools/test.py --out adds mmengine's DumpResults
log_processor = dict(by_epoch=False)
env_cfg = dict(dist_cfg=dict(backend='nccl'))  # the CPU path must override
'''


def _run_script(tmp_path, script, *args):
    """Run tools/<script> with the toy model importable and CUDA hidden."""
    _write(tmp_path / 'cli_toy_model.py', TOY_MODULE)
    env = dict(os.environ, PORT=str(_free_port()), PYTHONPATH=str(tmp_path),
               TOY_MARKER_DIR=str(tmp_path), CUDA_VISIBLE_DEVICES='',
               OMP_NUM_THREADS='1')
    env.pop('LOCAL_RANK', None)
    proc = subprocess.run(
        ['bash', osp.join(REPO_ROOT, 'tools', script), *args],
        cwd=str(tmp_path), env=env, capture_output=True, text=True,
        timeout=180)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return log


def test_dist_train_script_on_cpu(tmp_path):
    config = _write(tmp_path / 'toy_cfg.py', TOY_CONFIG)
    work_dir = tmp_path / 'work'
    log = _run_script(tmp_path, 'dist_train.sh', config, '2',
                      '--work-dir', str(work_dir))
    assert (work_dir / 'iter_2.pth').is_file(), log[-4000:]
    for rank in range(2):
        assert (tmp_path / f'rank{rank}.txt').read_text() == 'gloo 2'
    assert 'Distributed training: True' in log


def test_dist_test_script_on_cpu(tmp_path):
    config = _write(tmp_path / 'toy_cfg.py', TOY_CONFIG)
    # Plain tensors only, so torch.load(weights_only=True) accepts it.
    ckpt = str(tmp_path / 'toy.pth')
    torch.save(dict(state_dict={'linear.weight': torch.ones(1, 2),
                                'linear.bias': torch.zeros(1)}), ckpt)
    out = tmp_path / 'preds.pkl'
    log = _run_script(tmp_path, 'dist_test.sh', config, ckpt, '2',
                      '--work-dir', str(tmp_path / 'work'), '--out', str(out))
    with open(out, 'rb') as f:
        preds = pickle.load(f)
    # Both ranks' halves come back in dataset order: pred = 2 * index.
    assert [round(float(p)) for p in preds] == list(range(0, 16, 2)), log


@pytest.mark.skipif(sys.platform != 'linux', reason='bash scripts')
@pytest.mark.parametrize('script', ['dist_train.sh', 'dist_test.sh',
                                    'slurm_train.sh', 'slurm_test.sh'])
def test_scripts_need_arguments(script):
    proc = subprocess.run(['bash', osp.join(REPO_ROOT, 'tools', script)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and 'usage:' in proc.stderr
