"""Shared pytest behaviour: tests marked ``slow`` run only when selected with ``-m slow``; the
end-to-end runs trained once per session for every module that needs a real checkpoint; the
kernel switch of the tests that compare code paths; Triton's interpreter where no GPU is."""
import contextlib
import os

import pytest
import torch

if not torch.cuda.is_available():  # the Triton kernels run interpreted on CPU tensors
    os.environ.setdefault('TRITON_INTERPRET', '1')  # read when a kernel is decorated

from e2e_runs import DET_CFG, SEG_CFG, det_options, seg_options, train_run


def pytest_collection_modifyitems(config, items):
    if 'slow' in (config.getoption('markexpr') or ''):
        return
    skip = pytest.mark.skip(reason='slow: select with -m slow')
    for item in items:
        if 'slow' in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope='session')
def e2e_shapes(tmp_path_factory):
    """A small copy of the shapes data (COCO and ADE20K layouts) for the end-to-end tests."""
    from mmeffvit.datasets import generate_shapes
    root = tmp_path_factory.mktemp('shapes')
    generate_shapes(str(root), num_train=8, num_val=3, min_size=96, max_size=150)
    return root


@pytest.fixture(scope='session')
def det_run(e2e_shapes, tmp_path_factory):
    """Mask R-CNN (FLatten-PVT-T) trained through tools/train.py, validated and saved at iteration 2
    (``iter_2.pth``). Shared: tests read it, and write only into their own copy or work dir."""
    work = tmp_path_factory.mktemp('det')
    out = train_run(DET_CFG, work, det_options(e2e_shapes, 2))
    assert 'loss_mask' in out and 'Iter(train) [2/2]' in out
    return str(work)


@pytest.fixture(scope='session')
def seg_run(e2e_shapes, tmp_path_factory):
    """Semantic FPN (FLatten-PVT-T), like ``det_run``."""
    work = tmp_path_factory.mktemp('seg')
    out = train_run(SEG_CFG, work, seg_options(e2e_shapes, 2))
    assert 'decode.loss_ce' in out and 'Iter(train) [2/2]' in out
    return str(work)


class KernelSwitch:
    """Changes the kernel policy for the rest of a test, as ``MMEFFVIT_OPS`` /
    ``MMEFFVIT_LINEAR_KERNEL`` would for a process: ``switch()`` (compiled kernels required),
    ``switch(required=False, cpu_gemm='onednn')``, ``switch.reference()``. Each call nests in
    the ones before; all are undone, innermost first, when the test ends."""

    def __init__(self):
        self._blocks = contextlib.ExitStack()

    def __call__(self, required=True, cpu_gemm=None):
        from mmeffvit import ops
        self._blocks.enter_context(ops.use_kernels(required=required, cpu_gemm=cpu_gemm))

    def reference(self):
        from mmeffvit import ops
        self._blocks.enter_context(ops.use_reference())

    def close(self):
        self._blocks.close()


@pytest.fixture
def switch_kernels():
    """A :class:`KernelSwitch` for the test (``mmeffvit.ops.use_kernels`` / ``use_reference``
    blocks, closed after it)."""
    switch = KernelSwitch()
    yield switch
    switch.close()


@pytest.fixture(params=['reference', 'onednn', 'aten'])
def kernel_path(request, switch_kernels):
    """The policy a test runs under, by name: ``use_reference()``, or the kernels where built
    with the CPU linears on each GEMM the policy can choose (skipped where this torch lacks
    oneDNN's linear)."""
    if request.param == 'reference':
        switch_kernels.reference()
    else:
        from mmeffvit.ops.policy import ONEDNN_LINEAR
        if request.param == 'onednn' and not ONEDNN_LINEAR:
            pytest.skip('this torch has no oneDNN linear kernel')
        switch_kernels(required=False, cpu_gemm=request.param)
    return request.param


@pytest.fixture(params=['onednn', 'aten'])
def linear_gemm(request):
    """Runs a test with the CPU linears on each GEMM the policy can choose
    (``use_kernels(required=False, cpu_gemm=...)``); the test gets the name."""
    from mmeffvit import ops
    from mmeffvit.ops.policy import ONEDNN_LINEAR
    if request.param == 'onednn' and not ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    with ops.use_kernels(required=False, cpu_gemm=request.param):
        yield request.param
