"""Every backbone exports to ONNX (``torch.onnx.export(..., dynamo=True)``) with the default
policy and standard operators only, and onnxruntime gives its eager outputs on an input the
export never saw.

While ``torch.export`` traces, every operator runs its PyTorch reference
(``mmeffvit.ops.policy.compiling``), so nothing needs setting. The default run exports one
backbone at a dense size that no stride or window divides (padding and cropping included);
every backbone at 224² and at that size is marked slow.
"""
import os.path as osp

import numpy as np
import pytest
import torch

from test_backbone_contract import NAMES, build

onnxruntime = pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')

RTOL = 1e-4  # of the largest output magnitude (float32 on both sides, other kernels)
DENSE_ODD = (333, 517)
REPO = osp.join(osp.dirname(osp.abspath(__file__)), '..')


def export_and_compare(model, hw):
    """Export at ``hw``, run onnxruntime on a fresh input; returns the largest difference
    relative to each output's largest magnitude."""
    model.eval()
    program = torch.onnx.export(model, (torch.randn(1, 3, *hw),), dynamo=True, verbose=False)
    proto = program.model_proto
    domains = {node.domain for node in proto.graph.node} | {f.domain for f in proto.functions}
    assert domains <= {'', 'ai.onnx'}, f'non-standard operator domains: {domains}'
    session = onnxruntime.InferenceSession(proto.SerializeToString(),
                                           providers=['CPUExecutionProvider'])
    x = torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(1))
    outs = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        ref = [r.numpy() for r in model(x)]
    assert [o.shape for o in outs] == [r.shape for r in ref]
    return max(float(np.abs(o - r).max() / np.abs(r).max()) for o, r in zip(outs, ref))


def test_a_windowed_backbone_exports_at_an_odd_dense_size():
    torch.manual_seed(0)
    assert export_and_compare(build('FLattenSwin'), DENSE_ODD) < RTOL


@pytest.mark.slow
@pytest.mark.parametrize('hw', [(224, 224), DENSE_ODD], ids=['224', 'odd'])
@pytest.mark.parametrize('name', NAMES)
def test_every_backbone_exports(name, hw):
    torch.manual_seed(0)
    assert export_and_compare(build(name), hw) < RTOL


# --- tools/deployment/export_onnx.py --------------------------------------------------------
def _export_tool():
    import importlib.util
    path = osp.join(REPO, 'tools', 'deployment', 'export_onnx.py')
    spec = importlib.util.spec_from_file_location('export_onnx_tool', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tool_exports_a_backbone_with_its_checkpoint(tmp_path, capsys):
    tool = _export_tool()
    config = osp.join(REPO, 'configs/flatten/mask_rcnn_flatten_pvt_t_1x_coco.py')
    torch.manual_seed(3)
    backbone = tool.build_model(config, None, (224, 224), True)
    ckpt = tmp_path / 'backbone.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in backbone.state_dict().items()}},
               ckpt)
    out = tmp_path / 'pvt.onnx'
    tool.main([config, str(ckpt), '--shape', '224', '224', '--backbone-only', '--out', str(out)])
    printed = capsys.readouterr().out
    assert out.is_file() and 'backbone exported' in printed and '4 outputs' in printed
    assert f'{len(backbone.state_dict())} of ' in printed  # every backbone tensor loaded


@pytest.mark.slow
@pytest.mark.parametrize('config,backbone_only', [
    ('configs/lavit/retinanet_lavit_t_1x_coco.py', False),
    ('configs/focal/retinanet_focal_t_1x_coco.py', True),
    ('configs/flatten/upernet_flatten_swin_t_160k_ade20k.py', False)])
def test_tool_exports_configs(config, backbone_only, tmp_path, capsys):
    argv = [osp.join(REPO, config), '--shape', '256', '320', '--out', str(tmp_path / 'm.onnx')]
    _export_tool().main(argv + (['--backbone-only'] if backbone_only else []))
    assert 'largest relative difference' in capsys.readouterr().out


@pytest.mark.slow
def test_tool_names_where_a_two_stage_detector_fails(tmp_path):
    with pytest.raises(SystemExit) as exc:
        _export_tool().main([osp.join(REPO, 'configs/flatten/mask_rcnn_flatten_pvt_t_1x_coco.py'),
                             '--shape', '256', '320', '--out', str(tmp_path / 'm.onnx')])
    message = str(exc.value)
    assert message.startswith('export failed') and 'in mmdet/' in message
    assert '--backbone-only' in message
