"""Evaluate a checkpoint of an mmdet, mmseg or mmpretrain model.

The toolbox is taken from the config's ``default_scope``; it decides what
``--out`` writes (mmdet: a .pkl of detections, mmseg: a directory of
prediction PNGs). Examples::

    python tools/test.py CONFIG CHECKPOINT [--out OUT] [--show-dir DIR]
    bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py options]
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
    ConfigError, add_common_args, apply_test_args, build_runner, finish_args, load_config,
    finish_distributed, setup_cpu_distributed, check_inputs)
from mmeffvit.engine.errors import run_cli  # noqa: E402
from mmeffvit.utils.allocator import retain_freed_memory  # noqa: E402
from mmeffvit.utils.checkpoint import (add_trust_argument,  # noqa: E402
                                       apply_trust_argument)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the testing tool."""
    parser = argparse.ArgumentParser(
        description='Test a checkpoint with an OpenMMLab 2.x config')
    parser.add_argument('config', help='path of the test config')
    parser.add_argument('checkpoint', help='checkpoint file to evaluate')
    parser.add_argument(
        '--out', help='mmdet/mmpretrain: pickle file (.pkl/.pickle) to dump '
        'the raw predictions to; mmseg: directory for prediction PNGs')
    parser.add_argument(
        '--show', action='store_true', help='display each prediction')
    parser.add_argument(
        '--show-dir', help='save images with drawn predictions here (relative paths: '
        'mmdet <work_dir>/<timestamp>/DIR, mmseg <work_dir>/DIR/vis_data/vis_image, '
        'mmpretrain <work_dir>/<timestamp>/DIR)')
    parser.add_argument(
        '--wait-time', type=float, default=2,
        help='seconds each image stays on screen with --show')
    parser.add_argument(
        '--tta', action='store_true', help='enable test-time augmentation')
    add_common_args(parser)
    add_trust_argument(parser)
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and export LOCAL_RANK."""
    return finish_args(build_parser().parse_args(argv))


def main(argv=None) -> None:
    """Run evaluation as described by the command line."""
    parser = build_parser()
    args = finish_args(parser.parse_args(argv))
    apply_trust_argument(args)
    try:
        cfg = apply_test_args(load_config(args), args)
    except ConfigError as err:
        parser.error(str(err))
    check_inputs(cfg, ('test', ))
    setup_cpu_distributed(cfg, args.launcher)
    build_runner(cfg).test()
    finish_distributed()


if __name__ == '__main__':
    retain_freed_memory()  # glibc keeps freed blocks for reuse (MMEFFVIT_MALLOC)
    run_cli(main)
