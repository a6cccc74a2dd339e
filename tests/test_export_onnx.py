"""Every backbone exports to ONNX (``torch.onnx.export(..., dynamo=True)``) with the default
policy and standard operators only, and onnxruntime gives its eager outputs on an input the
export never saw.

While ``torch.export`` traces, every operator runs its PyTorch reference
(``mmeffvit.ops.policy.compiling``), so nothing needs setting. The default run exports one
backbone at a dense size that no stride or window divides (padding and cropping included);
every backbone at 224² and at that size is marked slow.
"""
import numpy as np
import pytest
import torch

from test_backbone_contract import NAMES, build

onnxruntime = pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')

RTOL = 1e-4  # of the largest output magnitude (float32 on both sides, other kernels)
DENSE_ODD = (333, 517)


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
