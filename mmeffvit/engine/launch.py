"""Logic behind ``tools/train.py`` and ``tools/test.py``.

Loads and edits configs, prepares CPU-only distributed runs and builds the
runner for mmdet, mmseg and mmpretrain alike; the toolbox is read from
``cfg.default_scope``.
"""
import argparse
import copy
import datetime
import logging
import os
import os.path as osp
import subprocess
import warnings
from typing import Optional

import torch
import torch.distributed as torch_dist
from mmengine.config import Config, ConfigDict, DictAction
from mmengine.logging import print_log

from .cpu_sync_bn import cpu_wrapper_type
from .data_checks import check_data_roots, install_dataset_checks
from .errors import ConfigError
from .hooks import add_default_hooks
from .resume import checkpoint_problem, find_resume_checkpoint

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """Add the options that train.py and test.py share to ``parser``."""
    parser.add_argument(
        '--work-dir', help='directory for logs and checkpoints (default: '
        'cfg.work_dir, else ./work_dirs/<config name>)')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config entries, e.g. "a.b=1 c=[1,2]" (no spaces '
        'inside a value unless quoted)')
    parser.add_argument(
        '--launcher', choices=LAUNCHERS, default='none',
        help='how the processes were started')
    parser.add_argument(
        '--debug', action='store_true',
        help='show the full traceback of config and data errors (also: MMEFFVIT_DEBUG=1)')
    # torch.distributed.launch passes --local-rank; older versions used _.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0,
                        help='set by the launcher; do not pass by hand')


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    """Export the launcher's local rank unless the environment has one."""
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def train_splits(cfg: Config) -> tuple:
    """The dataloaders a training run builds: train, and val when it validates."""
    return ('train', 'val') if cfg.get('val_cfg', None) else ('train', )


def check_inputs(cfg: Config, splits) -> None:
    """Check the data roots of ``splits`` and make dataset errors name their files.

    Raises:
        DataError: if a dataset's data_root does not exist.
    """
    install_dataset_checks()
    check_data_roots(cfg, splits)


def get_scope(cfg: Config) -> str:
    """Return the toolbox a config belongs to (``'mmengine'`` if unset)."""
    return cfg.get('default_scope', None) or 'mmengine'


def resolve_work_dir(cfg: Config, cli_work_dir: Optional[str],
                     config_path: str) -> str:
    """Set ``cfg.work_dir``: CLI, then the config, then ./work_dirs/<stem>."""
    if cli_work_dir is not None:
        cfg.work_dir = cli_work_dir
    elif cfg.get('work_dir', None) is None:
        stem = osp.splitext(osp.basename(config_path))[0]
        cfg.work_dir = osp.join('./work_dirs', stem)
    return cfg.work_dir


def load_config(args: argparse.Namespace) -> Config:
    """Read the config and apply the options both tools share."""
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    resolve_work_dir(cfg, args.work_dir, args.config)
    return cfg


def amp_device_available() -> bool:
    """Whether mmengine's AmpOptimWrapper can run on this machine."""
    from mmengine.device import get_device
    return get_device() in ('cuda', 'npu', 'mlu', 'musa')


def apply_train_args(cfg: Config, args: argparse.Namespace) -> Config:
    """Apply --amp, --auto-scale-lr and --resume to ``cfg`` and add mmeffvit's training hooks.

    Raises:
        ConfigError: if an option does not fit the config or the machine, or the config asks
            for mixed precision the mmdet 2 way (``fp16=dict(...)``, which mmengine ignores).
    """
    if cfg.get('fp16', None) is not None:
        raise ConfigError(
            f"the config sets fp16={cfg.fp16!r}, mmdet 2's mixed-precision key, which does "
            "nothing in mmdet 3 / mmengine (training would run in fp32). Delete it and pass "
            "--amp, or set optim_wrapper=dict(type='AmpOptimWrapper', loss_scale='dynamic', "
            "...) in the config")
    if args.amp:
        if not amp_device_available():
            raise ConfigError('--amp needs a GPU (CUDA), but none is '
                              'available on this machine; drop --amp to '
                              'train in fp32 on the CPU')
        if cfg.optim_wrapper.get('type') != 'AmpOptimWrapper':
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.loss_scale = 'dynamic'
    if args.auto_scale_lr:
        scale_cfg = cfg.get('auto_scale_lr', None)
        if not scale_cfg or 'base_batch_size' not in scale_cfg:
            raise ConfigError(
                '--auto-scale-lr needs "auto_scale_lr = dict('
                'base_batch_size=...)" in the config, which is missing')
        scale_cfg.enable = True
    add_default_hooks(cfg)
    if args.resume == 'auto':
        # The checkpoint is chosen here rather than by the runner, which neither passes over
        # a truncated one nor says plainly that there is none (see engine/resume.py).
        path, notes = find_resume_checkpoint(cfg.work_dir)
        for note in notes:
            _warn_on_rank0(note)
        if path is None:
            cfg.resume = False  # a fresh run; the config's load_from (if any) still applies
        else:
            cfg.resume, cfg.load_from = True, path
    elif args.resume is not None:
        problem = None if '://' in args.resume else checkpoint_problem(args.resume)
        if problem is not None:
            raise ConfigError(f'cannot resume from {args.resume}: {problem}')
        cfg.resume, cfg.load_from = True, args.resume
    return cfg


def _warn_on_rank0(message: str) -> None:
    if int(os.environ.get('RANK', '0')) == 0:  # every rank decides alike; one says so
        print_log(message, logger='current', level=logging.WARNING)


def _innermost_dataset(dataset_cfg: ConfigDict) -> ConfigDict:
    # Wrappers such as RepeatDataset keep the real dataset under 'dataset'.
    while 'dataset' in dataset_cfg:
        dataset_cfg = dataset_cfg['dataset']
    return dataset_cfg


# Per toolbox: the visualization hook's on-switch and its --show-dir key
# (mmseg's hook has none; it draws through the visualizer's save_dir).
_VIS_KEYS = dict(mmdet=('draw', 'test_out_dir'), mmseg=('draw', None),
                 mmpretrain=('enable', 'out_dir'))


def _enable_visualization(cfg: Config, args: argparse.Namespace) -> None:
    scope = get_scope(cfg)
    hook = cfg.get('default_hooks', {}).get('visualization', None)
    if hook is None:
        raise ConfigError('--show/--show-dir need a visualization hook, but '
                          'cfg.default_hooks has no "visualization" entry')
    if scope not in _VIS_KEYS:
        raise ConfigError(f'--show/--show-dir are not supported for '
                          f'default_scope={scope!r}')
    switch, dir_key = _VIS_KEYS[scope]
    hook[switch] = True
    if args.show:
        hook.show, hook.wait_time = True, args.wait_time
    if args.show_dir and dir_key:
        hook[dir_key] = args.show_dir
    elif args.show_dir:
        # mmseg draws through the visualizer, whose save_dir is otherwise relative to the
        # current directory: keep it under the work dir, as mmdet's hook does
        work_dir = cfg.get('work_dir', None)
        cfg.visualizer.save_dir = (args.show_dir if osp.isabs(args.show_dir) or not work_dir
                                   else osp.join(work_dir, args.show_dir))
    if scope == 'mmseg':
        hook['interval'] = 1  # its default (50) draws nothing for a val set under 50 images


# Toolboxes whose --tta falls back to flip TTA when the config has none.
_DEFAULT_TTA_MODELS = dict(
    mmdet=dict(type='DetTTAModel',
               tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5),
                            max_per_img=100)),
    mmpretrain=dict(type='AverageClsScoreTTA'))


def _enable_tta(cfg: Config) -> None:
    scope = get_scope(cfg)
    dataset_cfg = _innermost_dataset(cfg.test_dataloader.dataset)
    if scope in _DEFAULT_TTA_MODELS and 'tta_model' not in cfg:
        warnings.warn(f'no tta_model in the config; using {scope} defaults')
        cfg.tta_model = _DEFAULT_TTA_MODELS[scope]
    if scope in _DEFAULT_TTA_MODELS and 'tta_pipeline' not in cfg:
        # Flip TTA: the test pipeline with its packer replaced by one that
        # runs each image flipped and unflipped.
        warnings.warn('no tta_pipeline in the config; using flip TTA')
        pipeline = copy.deepcopy(dataset_cfg.pipeline)
        packer = copy.deepcopy(pipeline[-1])
        if 'meta_keys' in packer:
            packer.meta_keys = tuple(packer.meta_keys) + tuple(
                k for k in ('flip', 'flip_direction')
                if k not in packer.meta_keys)
        pipeline[-1] = dict(
            type='TestTimeAug',
            transforms=[[dict(type='RandomFlip', prob=0.),
                         dict(type='RandomFlip', prob=1.)], [packer]])
        cfg.tta_pipeline = pipeline
    if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
        raise ConfigError('--tta needs both "tta_model" and "tta_pipeline" '
                          'in the config')
    cfg.model = ConfigDict({**cfg.tta_model, 'module': cfg.model})
    dataset_cfg.pipeline = cfg.tta_pipeline


def _dump_predictions(cfg: Config, out: str) -> None:
    scope = get_scope(cfg)
    if scope == 'mmseg':
        # IoUMetric saves one PNG per image into output_dir.
        metrics = cfg.test_evaluator
        for metric in metrics if isinstance(metrics, list) else [metrics]:
            metric.output_dir, metric.keep_results = out, True
        return
    if not out.endswith(('.pkl', '.pickle')):
        raise ConfigError(f'--out must end in .pkl or .pickle, got {out!r}')
    dump = dict(type='DumpDetResults' if scope == 'mmdet' else
                'DumpResults', out_file_path=out)
    metrics = cfg.test_evaluator
    if isinstance(metrics, dict) and 'metrics' in metrics:
        metrics = metrics.metrics  # an explicit Evaluator wrapper
    if isinstance(metrics, list):
        metrics.append(dump)
    else:
        cfg.test_evaluator = [metrics, dump]


def apply_test_args(cfg: Config, args: argparse.Namespace) -> Config:
    """Apply the checkpoint, --show/--show-dir, --tta and --out to ``cfg``.

    Raises:
        ConfigError: if an option does not fit the config.
    """
    cfg.load_from = args.checkpoint
    if args.show or args.show_dir:
        _enable_visualization(cfg, args)
    if args.tta:
        _enable_tta(cfg)
    if args.out is not None:
        _dump_predictions(cfg, args.out)
    return cfg


# Where each launcher puts what torchrun calls RANK, WORLD_SIZE, LOCAL_RANK.
_LAUNCHER_ENV = dict(
    slurm=('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID'),
    mpi=('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE',
         'OMPI_COMM_WORLD_LOCAL_RANK'))


def init_cpu_process_group(launcher: str, timeout: Optional[int] = None,
                           backend: str = 'gloo') -> None:
    """Join the process group without touching CUDA.

    mmengine's ``init_dist`` calls ``torch.cuda.set_device``, which fails on
    CPU-only machines, so the launcher's environment is read here instead,
    as mmengine reads it, and exported in torchrun's terms.
    """
    env = os.environ
    if launcher in _LAUNCHER_ENV:
        rank, world_size, local_rank = _LAUNCHER_ENV[launcher]
        env['RANK'], env['WORLD_SIZE'] = env[rank], env[world_size]
        env['LOCAL_RANK'] = env.get(local_rank, '0')
        env.setdefault('MASTER_PORT', '29500')
        if launcher == 'slurm' and 'MASTER_ADDR' not in env:
            env['MASTER_ADDR'] = subprocess.getoutput(
                f'scontrol show hostname {env["SLURM_NODELIST"]} | head -n1')
    elif launcher != 'pytorch':
        raise ValueError(f'unknown launcher {launcher!r}')
    kwargs = {}
    if timeout is not None:
        kwargs['timeout'] = datetime.timedelta(seconds=timeout)
    torch_dist.init_process_group(
        backend=backend, init_method='env://', rank=int(env['RANK']),
        world_size=int(env['WORLD_SIZE']), **kwargs)


def setup_cpu_distributed(cfg: Config, launcher: str) -> bool:
    """Prepare a distributed run on a machine without CUDA.

    Joins a gloo process group before the runner exists (the runner skips
    its own initialisation when one is already up) and makes the DDP wrapper
    CPU-friendly (no device ids; SyncBN becomes CPUSyncBatchNorm). With CUDA,
    or without a launcher, nothing changes.

    Returns:
        bool: whether the CPU setup was applied.
    """
    if launcher == 'none' or torch.cuda.is_available():
        return False
    env_cfg = cfg.setdefault('env_cfg', ConfigDict())
    dist_cfg = env_cfg.setdefault('dist_cfg', ConfigDict())
    dist_cfg.backend = 'gloo'
    wrapper = cfg.get('model_wrapper_cfg', None)
    if wrapper is None:
        cfg.model_wrapper_cfg = dict(
            type='MMDistributedDataParallel', broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False))
        wrapper = cfg.model_wrapper_cfg
    from mmengine.registry import MODEL_WRAPPERS
    from torch.nn.parallel import DistributedDataParallel
    wrapper_cls = MODEL_WRAPPERS.get(wrapper.get('type', 'MMDistributedDataParallel'))
    if isinstance(wrapper_cls, type) and issubclass(wrapper_cls, DistributedDataParallel):
        # The runner fills device_ids=[LOCAL_RANK] for DDP wrappers unless
        # the key is present; DDP rejects device_ids for CPU modules.
        wrapper.setdefault('device_ids', None)
        # ...and refuses CUDA SyncBN in a CPU module: the wrapper's CPU variant converts it
        wrapper.type = cpu_wrapper_type(wrapper_cls)
    if not torch_dist.is_initialized():
        init_cpu_process_group(launcher, timeout=dist_cfg.get('timeout'))
    return True


def finish_distributed() -> None:
    """Leave the process group, if any, once the runner is done.

    mmengine never destroys it; gloo's worker threads then die in static destruction at exit,
    which now and then aborts a rank ("terminate called without an active exception") after a
    run that succeeded.
    """
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()
        torch_dist.destroy_process_group()


def build_runner(cfg: Config):
    """Build the runner named by ``cfg.runner_type`` or a plain Runner."""
    from mmengine.registry import RUNNERS, init_default_scope
    from mmengine.runner import Runner
    if 'runner_type' not in cfg:
        return Runner.from_cfg(cfg)
    # Let a toolbox-registered runner type resolve in its own scope.
    init_default_scope(get_scope(cfg))
    return RUNNERS.build(cfg)
