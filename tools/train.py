"""Train an mmdet, mmseg or mmpretrain model with mmeffvit backbones.

The toolbox is taken from the config's ``default_scope``. Examples::

    python tools/train.py CONFIG [--work-dir DIR] [--amp] [--resume [CKPT]]
    bash tools/dist_train.sh CONFIG NUM_PROCS [train.py options]
"""
import argparse
import os.path as osp
import sys

# Make the checkout importable without installing it: the configs import
# mmeffvit through custom_imports, and it must win over an installed copy.
REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if sys.path[0] != REPO_ROOT:
    sys.path.insert(0, REPO_ROOT)

import mmeffvit  # noqa: E402,F401  registers modules and checkpoint globals
from mmeffvit.engine.launch import (  # noqa: E402
    ConfigError, add_common_args, apply_train_args, build_runner, finish_args, load_config,
    finish_distributed, setup_cpu_distributed, check_inputs, train_splits)
from mmeffvit.engine.errors import run_cli  # noqa: E402
from mmeffvit.utils.allocator import retain_freed_memory  # noqa: E402
from mmeffvit.utils.checkpoint import (add_trust_argument,  # noqa: E402
                                       apply_trust_argument)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the training tool."""
    parser = argparse.ArgumentParser(
        description='Train a model from an OpenMMLab 2.x config')
    parser.add_argument('config', help='path of the training config')
    parser.add_argument(
        '--amp', action='store_true',
        help='train with automatic mixed precision (needs a GPU)')
    parser.add_argument(
        '--auto-scale-lr', action='store_true',
        help='scale the learning rate by the actual total batch size '
        'relative to cfg.auto_scale_lr.base_batch_size')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume training; without a value, from the latest checkpoint '
        'in the work dir, otherwise from the given checkpoint file')
    add_common_args(parser)
    add_trust_argument(parser)
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and export LOCAL_RANK."""
    return finish_args(build_parser().parse_args(argv))


def main(argv=None) -> None:
    """Run training as described by the command line."""
    parser = build_parser()
    args = finish_args(parser.parse_args(argv))
    apply_trust_argument(args)
    try:
        cfg = apply_train_args(load_config(args), args)
    except ConfigError as err:
        parser.error(str(err))
    check_inputs(cfg, train_splits(cfg))
    setup_cpu_distributed(cfg, args.launcher)
    build_runner(cfg).train()
    finish_distributed()


if __name__ == '__main__':
    retain_freed_memory(default=False)  # glibc keeps freed blocks for reuse (MMEFFVIT_MALLOC)
    run_cli(main)
