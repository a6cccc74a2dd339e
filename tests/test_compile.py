"""Every backbone under ``torch.compile(fullgraph=True)``: one graph, no graph break, in
inference and in a training step, on the default policy and under ``use_reference()``; outputs
and gradients equal to eager; no recompilation on a second call of the same size, and a new
size traced with symbolic sizes (multi-scale training) instead of failing.

While a compiler traces, every operator takes its PyTorch reference (the compiled CPU kernels
are opaque pybind calls to it; ``mmeffvit.ops.policy.compiling``) and per-shape caches are
bypassed, their NumPy tables traced (``mmeffvit.utils.geometry_cache``). The default run traces
the small configurations of ``test_backbone_contract`` with the ``eager`` backend (Dynamo's
capture, the graph run as is) and compiles one with Inductor; the dense configurations of the
benchmark and Inductor for every family are marked slow.
"""
import contextlib
import os.path as osp
import sys

import pytest
import torch
import torch._dynamo as dynamo

from mmeffvit.ops.policy import use_reference
from test_backbone_contract import NAMES, build

HERE = osp.dirname(osp.abspath(__file__))
SIZE = (75, 107)  # no stride or window divides it: padding and cropping are traced too


def _loss(outs):
    return sum((o.float() * (1 + i)).mean() for i, o in enumerate(outs))


def _eager_and_compiled(model, x, train, backend='eager'):
    """Outputs (and parameter gradients in training) of eager and of the compiled model."""
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    results = []
    for run in (model, compiled):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)  # drop path draws the same masks on both sides
        if train:
            outs = run(x)
            _loss(outs).backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters()
                     if p.grad is not None}
        else:
            with torch.no_grad():
                outs = run(x)
            grads = {}
        results.append(([o.detach() for o in outs], grads))
    return results, compiled


def _assert_close(results, rtol, atol):
    (eager_outs, eager_grads), (outs, grads) = results
    for a, b in zip(eager_outs, outs):
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol)
    assert grads.keys() == eager_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], eager_grads[name], rtol=rtol, atol=atol,
                                   msg=lambda m: f'{name}: {m}')


@pytest.mark.parametrize('mode', ['eval', 'train'])
@pytest.mark.parametrize('name', NAMES)
def test_one_graph_equal_to_eager_and_no_recompile(name, mode):
    dynamo.reset()
    torch.manual_seed(0)
    model = build(name).train(mode == 'train')
    x = torch.randn(2, 3, *SIZE)
    results, compiled = _eager_and_compiled(model, x, mode == 'train')
    _assert_close(results, rtol=1e-4, atol=1e-5)
    with dynamo.config.patch(error_on_recompile=True), torch.set_grad_enabled(mode == 'train'):
        compiled(x)


@pytest.mark.parametrize('name', ['FLattenSwin', 'FocalTransformer', 'LaViT'])
def test_one_graph_under_use_reference(name):
    dynamo.reset()
    model = build(name).eval()
    x = torch.randn(1, 3, *SIZE)
    with use_reference():
        explanation = dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]


@pytest.mark.parametrize('name', ['FLattenSwin', 'FLattenCSWin', 'FocalTransformer', 'LaViT'])
def test_a_new_size_is_a_new_static_graph(name):
    """Windows, stripes and pooled borders of other sizes (multi-scale training): each size
    its own graph with ``dynamic=False``, right outputs, none traced twice. (Dynamic shapes
    are not yet usable: the symbolic sizes of the nested ceil divisions make Dynamo's sympy
    simplification run for minutes.)"""
    dynamo.reset()
    model = build(name).eval()
    compiled = torch.compile(model, backend='eager', fullgraph=True, dynamic=False)
    sizes = (SIZE, (96, 131), (64, 64))
    with torch.no_grad():
        for size in sizes:
            x = torch.randn(1, 3, *size)
            for a, b in zip(model(x), compiled(x)):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        with dynamo.config.patch(error_on_recompile=True):
            for size in sizes:
                compiled(torch.randn(1, 3, *size))


def test_inductor_compile_matches_eager():
    """Inference through Inductor's generated code (training: the slow dense tests)."""
    dynamo.reset()
    torch.manual_seed(0)
    model = build('FLattenPVTv2').eval()
    results, _ = _eager_and_compiled(model, torch.randn(2, 3, 64, 96), False, 'inductor')
    _assert_close(results, rtol=1e-3, atol=1e-4)


def _dense_cases():
    sys.path.insert(0, osp.join(HERE, '..', 'tools', 'analysis'))
    import benchmark
    return {n: c for n, c in benchmark.CASES.items() if c[0] == 'mmeffvit'}


def _dense_model(name):
    from mmeffvit.analysis.benchmark_worker import build_case
    scope, cfg, _ = _dense_cases()[name]
    torch.manual_seed(0)
    return build_case(dict(scope=scope, cfg=cfg))


@pytest.mark.slow
@pytest.mark.parametrize('path', ['default', 'reference'])
@pytest.mark.parametrize('name', sorted(_dense_cases()))
def test_dense_configurations_are_one_graph(name, path):
    """``torch._dynamo.explain`` of the benchmark's configurations (drop path on), inference
    and training forward: no graph break."""
    model = _dense_model(name)
    for train in (False, True):
        dynamo.reset()
        model.train(train)
        with use_reference() if path == 'reference' else contextlib.nullcontext():
            explanation = dynamo.explain(model)(torch.randn(1, 3, 256, 320))
        assert explanation.graph_break_count == 0, (
            train, [b.reason.splitlines()[0] for b in explanation.break_reasons])


@pytest.mark.slow
@pytest.mark.parametrize('path', ['default', 'reference'])
@pytest.mark.parametrize('name', sorted(_dense_cases()))
def test_dense_configurations_compile_with_inductor(name, path):
    dynamo.reset()
    model = _dense_model(name)
    context = use_reference() if path == 'reference' else contextlib.nullcontext()
    with context:
        for train in (False, True):
            model.train(train)
            results, _ = _eager_and_compiled(model, torch.randn(1, 3, 256, 320), train,
                                             'inductor')
            _assert_close(results, rtol=2e-3, atol=2e-4)
