"""Export a config's model (or only its backbone) to ONNX and check the file in onnxruntime.

The export is ``torch.onnx.export(..., dynamo=True)`` at a fixed input size; every mmeffvit
operator runs its PyTorch reference while exporting, so the file holds standard ONNX operators
only. onnxruntime then runs the file on a fresh random input and the largest difference from
the PyTorch model, relative to each output's largest magnitude, is printed (exit status 1
above ``--rtol``). The whole model is exported in the toolboxes' tensor mode (backbone, neck
and heads without post-processing) where its operators allow; a detector whose tensor mode
decodes proposals with NMS (two-stage) does not export: use ``--backbone-only``. Examples::

    python tools/deployment/export_onnx.py configs/flatten/mask_rcnn_flatten_pvt_t_1x_coco.py \\
        --shape 800 1344 --backbone-only
    python tools/deployment/export_onnx.py configs/lavit/retinanet_lavit_t_1x_coco.py CKPT \\
        --shape 512 512 --out work_dirs/retinanet_lavit_t.onnx
"""
import argparse
import os
import os.path as osp
import re
import sys
import traceback

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if sys.path[0] != REPO_ROOT:
    sys.path.insert(0, REPO_ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import mmeffvit  # noqa: E402,F401  registers the backbones
from mmeffvit.analysis.models import TensorModeForward, build_for_inference  # noqa: E402


def build_parser():
    """Return the argument parser of the tool."""
    parser = argparse.ArgumentParser(description='Export a model to ONNX and check it in '
                                     'onnxruntime')
    parser.add_argument('config', help='mmdet / mmseg / mmpretrain config')
    parser.add_argument('checkpoint', nargs='?', help='weights (default: random init)')
    parser.add_argument('--shape', type=int, nargs=2, required=True, metavar=('H', 'W'),
                        help='input size of the exported graph')
    parser.add_argument('--backbone-only', action='store_true',
                        help="export model.backbone (its multi-scale feature maps)")
    parser.add_argument('--out', help='ONNX file (default: work_dirs/<config>[_backbone].onnx)')
    parser.add_argument('--rtol', type=float, default=1e-4,
                        help='largest accepted difference, relative to the output magnitude')
    return parser


class FlatTensorMode(TensorModeForward):
    """The model's tensor-mode forward with its outputs as a flat tuple."""

    def forward(self, inputs):
        return tuple(tree_leaves(super().forward(inputs)))


def build_model(cfg_path, checkpoint, shape, backbone_only):
    """The module to export: the config's model in tensor mode, or its backbone."""
    model, data, _, _ = build_for_inference(cfg_path, shape)
    if checkpoint:
        load_weights(model, checkpoint)
    if backbone_only:
        return model.backbone
    return FlatTensorMode(model, data['data_samples']).eval()


def load_weights(model, path):
    """Load a checkpoint's state dict without running code from the file."""
    from mmeffvit.utils.checkpoint import load_checkpoint_file
    ckpt = load_checkpoint_file(path, tensors_only=True)
    state = ckpt.get('state_dict', ckpt) if isinstance(ckpt, dict) else ckpt
    own = model.state_dict()
    fits = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    if not fits:
        raise SystemExit(f'{path}: no tensor matches the model of the config (first keys: '
                         f'{list(state)[:3]})')
    model.load_state_dict(fits, strict=False)
    print(f'{path}: {len(fits)} of {len(own)} tensors loaded')


def failure(err):
    """What an export error comes down to: the innermost cause, the operator it names (if
    any) and the last place outside torch that its traceback passed through."""
    chain = []
    while err is not None and len(chain) < 16:
        chain.append(err)
        err = err.__cause__ or err.__context__
    root = chain[-1]
    op = None
    for e in reversed(chain):
        found = re.search(r'\b((?:aten|prims|mmeffvit|mmcv|torchvision)(?:\.\w+)+|'
                          r'torch\.ops\.[\w.]+)', str(e))
        if found:
            op = found.group(1)
            break
    frames = [f for f in traceback.extract_tb(root.__traceback__)
              if f'{os.sep}torch{os.sep}' not in f.filename]
    where = (f'{frames[-1].filename.split("site-packages" + os.sep)[-1]}:{frames[-1].lineno} '
             f'({frames[-1].name})' if frames else None)
    first = next((line for line in str(root).splitlines() if line.strip()), '')
    return f'{type(root).__name__}: {first}', op, where


def export(module, shape, out):
    """Export ``module`` at ``shape`` to ``out``; a SystemExit naming the operator on failure."""
    x = torch.randn(1, 3, *shape)
    try:
        with torch.no_grad():
            program = torch.onnx.export(module, (x, ), dynamo=True, verbose=False)
    except Exception as err:  # noqa: BLE001  every exporter error becomes one clear message
        cause, op, where = failure(err)
        raise SystemExit(
            f"export failed{f' at operator {op}' if op else ''}"
            f"{f', in {where}' if where else ''}: {cause}\n(a two-stage detector or other "
            'post-processing in tensor mode: try --backbone-only)') from err
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    program.save(out)
    return program


def compare(module, path, shape):
    """Largest difference of onnxruntime's outputs from the module's on a fresh input."""
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    x = torch.randn(1, 3, *shape, generator=torch.Generator().manual_seed(1))
    outs = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        ref = [r.numpy() for r in tree_leaves(module(x))]
    if [o.shape for o in outs] != [r.shape for r in ref]:
        raise SystemExit(f'onnxruntime gave shapes {[o.shape for o in outs]}, PyTorch '
                         f'{[r.shape for r in ref]}')
    return max(float(np.abs(o - r).max() / max(np.abs(r).max(), 1e-12))
               for o, r in zip(outs, ref)), len(outs)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not osp.isfile(args.config):
        raise SystemExit(f'config not found: {args.config}')
    stem = osp.splitext(osp.basename(args.config))[0]
    out = args.out or osp.join('work_dirs', stem + ('_backbone' if args.backbone_only else '')
                               + '.onnx')
    torch.manual_seed(0)
    module = build_model(args.config, args.checkpoint, tuple(args.shape), args.backbone_only)
    export(module, tuple(args.shape), out)
    diff, n = compare(module, out, tuple(args.shape))
    what = 'backbone' if args.backbone_only else 'model (tensor mode)'
    print(f'{stem}: {what} exported to {out} at {args.shape[0]}x{args.shape[1]}; onnxruntime '
          f'vs PyTorch on a fresh input, {n} outputs: largest relative difference {diff:.1e}')
    if not diff <= args.rtol:
        raise SystemExit(f'difference {diff:.1e} above --rtol {args.rtol:g}')


if __name__ == '__main__':
    main()
