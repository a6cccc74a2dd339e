"""Kernels per CUDA forward, counted on this CPU with fake CUDA tensors
(``mmeffvit.analysis.kernel_count``), held to the committed ceilings of
``tests/data/kernel_budget.json`` (written by ``tools/analysis/count_kernels.py --budget``):
no backbone launches more kernels than its ceiling, on the default policy and with the Triton
kernels selected (``triton-eval``, ``triton-train``), and none reaches a data-dependent
operator (a device-to-host sync on a GPU) that the budget does not list. Lower a ceiling, or
drop a listed operator, in the commit that removes kernels or syncs.
"""
import json
import os.path as osp
import sys

import pytest
import torch
import torch.nn as nn

from mmeffvit import ops
from mmeffvit.analysis.kernel_count import count_backbone

HERE = osp.dirname(osp.abspath(__file__))
BUDGET = json.load(open(osp.join(HERE, 'data', 'kernel_budget.json')))
sys.path.insert(0, osp.join(HERE, '..', 'tools', 'analysis'))
import benchmark  # noqa: E402


@pytest.mark.parametrize('mode', ['eval', 'train', 'triton-eval', 'triton-train'])
@pytest.mark.parametrize('name', sorted(BUDGET['cases']))
def test_kernels_within_budget_and_no_new_sync(name, mode):
    from mmeffvit.analysis.benchmark_worker import build_case
    scope, cfg, _ = benchmark.CASES[name]
    budget = BUDGET['cases'][name][mode]
    with ops.use_kernels(required=False, triton=mode.startswith('triton')):
        count = count_backbone(build_case(dict(scope=scope, cfg=cfg)), tuple(BUDGET['shape']),
                               BUDGET['batch'], torch.float32, mode.endswith('train'))
    new = sorted(set(count.data_dependent) - set(budget['data_dependent']))
    assert not new, f'{name} ({mode}): data-dependent operators not in the budget: {new}'
    assert count.kernels <= budget['kernels'], (
        f"{name} ({mode}): {count.kernels} kernels, budget {budget['kernels']}")


@pytest.mark.parametrize('name', sorted(BUDGET['cases']))
def test_no_sync_at_an_odd_size(name):
    """Padded windows, stripes and pooled borders at a size no stride divides: no forward,
    eval or training, reads tensor data on the host (index tables are built on the host)."""
    from mmeffvit.analysis.benchmark_worker import build_case
    scope, cfg, _ = benchmark.CASES[name]
    for train in (False, True):
        count = count_backbone(build_case(dict(scope=scope, cfg=cfg)), (333, 517), 1,
                               torch.float32, train)
        assert count.data_dependent == [], (name, train)


def test_every_mmeffvit_case_has_a_budget():
    cases = {n for n, (scope, _, _) in benchmark.CASES.items() if scope == 'mmeffvit'}
    assert set(BUDGET['cases']) == cases


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(24, 16), nn.Linear(16, 4)

    def forward(self, x):
        return [self.fc2(torch.relu(self.fc1(x.flatten(1))))]


def test_counts_a_known_forward():
    """Independent count: two linears on a 2-D input are two ``addmm`` and the ReLU one
    kernel; ``flatten`` and the weights' transposes are views. Bytes: each kernel's inputs and
    output; FLOPs: 2·m·n·k per product."""
    count = count_backbone(TwoLayers(), shape=(2, 4), batch=3)
    assert count.kernels == 3 and dict(count.by_op) == {'aten.addmm': 2, 'aten.relu': 1}
    assert count.data_dependent == []
    floats = (16 + 3 * 24 + 16 * 24 + 3 * 16) + (3 * 16 + 3 * 16) + (4 + 3 * 16 + 4 * 16 + 3 * 4)
    assert count.bytes == 4 * floats
    assert count.flops == 2 * 3 * (24 * 16 + 16 * 4)


class Synced(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x.mean((2, 3)))
        if self.how == 'mask':
            return [y[y > 0]]
        if self.how == 'item':
            return [y * y.max().item()]
        return [y.nonzero()]


@pytest.mark.parametrize('how', ['mask', 'item', 'nonzero'])
def test_data_dependent_operators_are_reported_with_their_caller(how):
    count = count_backbone(Synced(how), shape=(4, 4), batch=2)
    assert count.data_dependent and count.data_dependent[-1].startswith('stopped')
    assert 'test_kernel_budget.py' in count.data_dependent[0]


def test_tool_writes_the_table_between_markers_and_the_budget(tmp_path):
    import count_kernels
    out, budget = tmp_path / 'gpu.md', tmp_path / 'budget.json'
    out.write_text('# GPU\n\nkept above\n\n<!-- kernel-counts:start -->\nstale table\n'
                   '<!-- kernel-counts:end -->\n\nkept below\n')
    rows = count_kernels.main(['--cases', 'PVT-T,LaViT-T', '--shape', '64x96', '--batch', '1',
                               '--out', str(out), '--budget', str(budget)])
    text = out.read_text()
    assert 'kept above' in text and 'kept below' in text and 'stale table' not in text
    lavit = rows['LaViT-T']['fp32-eval'].kernels
    ratio = lavit / rows['PVT-T']['fp32-eval'].kernels
    assert f'| LaViT-T | PVT-T | {lavit} | {ratio:.2f} |' in text
    written = json.loads(budget.read_text())
    assert written['shape'] == [64, 96] and set(written['cases']) == {'LaViT-T'}
    assert written['cases']['LaViT-T']['eval'] == dict(kernels=lavit, data_dependent=[])
    assert set(written['cases']['LaViT-T']) == {'eval', 'train', 'triton-eval', 'triton-train'}


def test_the_count_sees_the_unhooked_paths():
    """Layers take other paths where hooks watch them (``_without_hooks``); the counter must
    not install global module hooks (torch's FlopCounterMode does)."""
    from torch.nn.modules import module as torch_module
    seen = []

    class Probe(TwoLayers):
        def forward(self, x):
            seen.append(bool(torch_module._global_forward_hooks
                             or torch_module._global_forward_pre_hooks))
            return super().forward(x)

    count_backbone(Probe(), shape=(2, 4), batch=1)
    assert seen == [False, False]


@pytest.mark.parametrize('dtype,mask,head_dims,expected', [
    (torch.bfloat16, None, (32, 32), {'aten._scaled_dot_product_flash_attention': 1}),
    (torch.float16, None, (30, 30), {'aten._scaled_dot_product_flash_attention': 1}),
    (torch.float32, None, (32, 32), {'aten._scaled_dot_product_efficient_attention': 1}),
    (torch.bfloat16, 'float', (32, 32), {'aten._scaled_dot_product_efficient_attention': 1}),
    (torch.bfloat16, 'bool', (32, 32), {'aten.full_like': 1, 'aten.masked_fill_': 1,
                                        'aten._scaled_dot_product_efficient_attention': 1}),
    (torch.bfloat16, None, (40, 32), {'aten._scaled_dot_product_efficient_attention': 1}),
    (torch.float32, None, (30, 30), None),  # no fused kernel: the math path
])
def test_sdpa_counts_the_kernel_a_gpu_would_choose(dtype, mask, head_dims, expected):
    """Fake CUDA tensors on a machine without a GPU: flash without a mask in 16 bits,
    memory-efficient with a mask, fp32 or a value head of its own size, math otherwise."""
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mmeffvit.analysis.kernel_count import FusedSDPAChoice, KernelCounter
    if torch.cuda.is_available():
        pytest.skip('a GPU makes its own choice')
    d, e = head_dims
    with FakeTensorMode():
        q = torch.empty(2, 3, 64, d, device='cuda', dtype=dtype)
        k = torch.empty(2, 3, 80, d, device='cuda', dtype=dtype)
        v = torch.empty(2, 3, 80, e, device='cuda', dtype=dtype)
        attn_mask = {None: None,
                     'float': torch.empty(2, 1, 64, 80, device='cuda', dtype=dtype),
                     'bool': torch.empty(1, 1, 1, 80, device='cuda', dtype=torch.bool)}[mask]
        with FusedSDPAChoice(), KernelCounter() as counter:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    assert out.shape == (2, 3, 64, e) and out.dtype == dtype
    by_op = dict(counter.count.by_op)
    if expected is None:
        assert 'aten.bmm' in by_op and not any('_scaled_dot_product_' in o for o in by_op)
    else:
        assert by_op == expected
    assert counter.count.flops == 2 * 2 * 3 * 64 * 80 * (d + e)  # q·kᵀ and the weighted sum
