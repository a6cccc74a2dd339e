"""The GPU profile tool (tools/analysis/profile_gpu.py) and the GPU scripts' benchmark options,
run on the CPU stand-in (ATen operators for kernels)."""
import json
import os
import os.path as osp
import subprocess
import sys

import torch

from mmeffvit.analysis.backbone_step import backbone_step
from test_benchmark import bench

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOL = osp.join(REPO_ROOT, 'tools', 'analysis', 'profile_gpu.py')


class _TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return y, y.mean((2, 3))


def test_training_step_takes_the_optimiser_step_only_when_asked():
    x = torch.randn(2, 3, 8, 8)
    for optimizer, moves in ((None, False), ('adamw', True)):
        torch.manual_seed(0)
        model = _TwoOutputs().train()
        before = model.conv.weight.detach().clone()
        backbone_step(model, model, x, 'train', x.device, torch.float32, optimizer)()
        assert model.conv.weight.grad is not None
        assert (not torch.equal(model.conv.weight, before)) == moves, optimizer
    model = _TwoOutputs().eval()
    before = model.conv.weight.detach().clone()
    backbone_step(model, model, x, 'infer', x.device, torch.float32, 'adamw')()
    assert torch.equal(model.conv.weight, before) and model.conv.weight.grad is None


def test_batch_defaults_and_the_method_text():
    args = bench.parse_args(['--cases', 'PVT-T'])
    assert args.batch == 1 and args.optimizer == 'none'
    assert bench.parse_args(['--config', osp.join(REPO_ROOT, 'configs', 'demo',
                                                  'fpn_flatten_pvt_t_80k_shapes.py')]).batch == 2
    args = bench.parse_args(['--cases', 'PVT-T', '--batch', '2', '--optimizer', 'adamw'])
    jobs = [j for g in bench.build_schedule(args) for j in g if j['kind'] == 'backbone']
    assert jobs and all(j['batch'] == 2 for j in jobs)
    text = ' '.join(bench.report._method_lines(dict(options=dict(
        isolate='case', device='cuda', warmup=1, sweep_warmup=1, reps=1, backbone_batch=2,
        optimizer='adamw'))))
    assert '2 images `2×3×H×W`' in text and 'AdamW step' in text
    old = ' '.join(bench.report._method_lines(dict(options=dict(
        isolate='case', device='cuda', warmup=1, sweep_warmup=1, reps=1, batch=2))))
    assert 'one image `1×3×H×W`' in old and 'no optimiser' in old  # earlier runs' JSON


def test_profile_tool_on_the_cpu_stand_in(tmp_path):
    """Kernels (here ATen operators) of an inference and a training step with AdamW, the
    counter's forward count beside them, written between the markers of an existing page."""
    out = tmp_path / 'gpu.md'
    out.write_text('# GPU\n\nkept\n')
    proc = subprocess.run(
        [sys.executable, TOOL, '--device', 'cpu', '--cases', 'PVTv2-B0', '--shape', '64x96',
         '--batch', '1', '--dtype', 'fp32', '--modes', 'infer,train', '--warmup', '1',
         '--out', str(out)],
        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=REPO_ROOT), capture_output=True,
        text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert text.startswith('# GPU\n\nkept\n') and '<!-- gpu-profiles:start -->' in text
    data = json.loads((tmp_path / 'gpu' / 'profiles.json').read_text())
    infer, train = (data['results']['PVTv2-B0'][m] for m in ('infer', 'train'))
    assert infer['kind'] == 'ATen operators (CPU)' and infer['top']
    # the training step runs the backward and the optimiser: more operators than inference
    assert train['launches'] > infer['launches'] > 0
    assert infer['counter']['float32'] > 0 and train['counter']['float32'] > 0
    ratio = infer['launches'] / infer['counter']['float32']
    assert f"| PVTv2-B0 | infer | {infer['step_ms']:.1f} | – | {infer['launches']} |" in text
    assert f"| {ratio:.2f} |" in text
    assert '#### PVTv2-B0, train: top ATen operators (CPU) by time' in text
