"""mmeffvit.ops.policy: the one reader of the kernel switches (issue 45)."""
import dataclasses
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch

from mmeffvit import ops
from mmeffvit.ops import policy as policy_module
from mmeffvit.ops.policy import (KernelPolicy, choose_cpu_gemm, from_environment, policy,
                                 use_kernels, use_reference)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
KERNEL_VARIABLES = ('MMEFFVIT_OPS', 'MMEFFVIT_LINEAR_KERNEL', 'MMEFFVIT_MALLOC',
                    'MMEFFVIT_TRITON')


def test_defaults_follow_the_cpu():
    p = from_environment({})
    assert isinstance(p, KernelPolicy)
    assert (p.mode, p.malloc, p.cpu_gemm_forced) == ('auto', 'default', False)
    assert p.cpu_capability == torch.backends.cpu.get_cpu_capability()
    avx512 = p.cpu_capability.startswith('AVX512') and policy_module.ONEDNN_LINEAR
    assert p.cpu_gemm == ('onednn' if avx512 else 'aten')
    assert p.kernel_gemm == 'auto'  # the C++ side applies the same AVX-512 rule
    assert (p.ops_for('cpu'), p.ops_for('cuda'), p.ops_for('meta')) == (
        'compiled', 'reference', 'reference')
    assert 'mode=' in str(p) and 'cpu_gemm=' in str(p)  # printable
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.mode = 'kernels'


@pytest.mark.parametrize('ops_value, mode, cpu, cuda', [
    ('0', 'reference', 'reference', 'reference'), ('', 'auto', 'compiled', 'reference'),
    ('auto', 'auto', 'compiled', 'reference'), ('1', 'kernels', 'compiled', 'compiled')])
def test_ops_switch(ops_value, mode, cpu, cuda):
    p = from_environment({'MMEFFVIT_OPS': ops_value})
    assert (p.mode, p.ops_for('cpu'), p.ops_for('cuda')) == (mode, cpu, cuda)
    assert p.reference == (mode == 'reference') and p.cuda_kernels == (mode == 'kernels')


@pytest.mark.parametrize('forced, kernel_gemm', [('aten', 'blas'), ('onednn', 'brgemm')])
def test_forced_gemm(forced, kernel_gemm):
    if forced == 'onednn' and not policy_module.ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    p = from_environment({'MMEFFVIT_LINEAR_KERNEL': forced})
    assert (p.cpu_gemm, p.cpu_gemm_forced, p.kernel_gemm) == (forced, True, kernel_gemm)
    with use_kernels(required=False, cpu_gemm=forced):  # the same choice for a block
        assert (policy().cpu_gemm, policy().kernel_gemm) == (forced, kernel_gemm)
        assert policy_module.choose_cpu_gemm('AVX2', forced) == forced  # wins over the ISA


@pytest.mark.parametrize('name, value', [('MMEFFVIT_OPS', '2'), ('MMEFFVIT_LINEAR_KERNEL', 'mkl'),
                                         ('MMEFFVIT_MALLOC', 'jemalloc'),
                                         ('MMEFFVIT_TRITON', 'yes')])
def test_unknown_values_are_clear_errors(name, value):
    with pytest.raises(ValueError, match=name):
        from_environment({name: value})
    if name == 'MMEFFVIT_LINEAR_KERNEL':
        with pytest.raises(ValueError, match=name):
            use_kernels(cpu_gemm=value)


@pytest.mark.parametrize('capability, override, expected', [
    ('AVX512', '', 'onednn'), ('AVX512_BF16', '', 'onednn'), ('AVX2', '', 'aten'),
    ('DEFAULT', '', 'aten'), ('AVX2', 'onednn', 'onednn'), ('AVX512', 'aten', 'aten')])
def test_cpu_gemm_rule(capability, override, expected):
    if expected == 'onednn' and not policy_module.ONEDNN_LINEAR:
        expected = 'aten'
    assert choose_cpu_gemm(capability, override) == expected


def test_triton_switch():
    """Off unless asked for (not yet verified on a GPU); ``use_reference()`` turns it off,
    ``use_kernels(triton=...)`` sets it for a block."""
    assert not from_environment({}).triton and not from_environment({'MMEFFVIT_TRITON': '0'}).triton
    assert from_environment({'MMEFFVIT_TRITON': '1'}).triton
    before = policy().triton
    with use_kernels(required=False, triton=True):
        assert policy().triton and policy().mode == 'auto'
        with use_reference():
            assert not policy().triton
        with use_kernels(required=False):  # unchanged unless given
            assert policy().triton
        with use_kernels(required=False, triton=False):
            assert not policy().triton
    assert policy().triton == before


def test_malloc_setting():
    for value, malloc in (('', 'default'), ('retain', 'retain'), ('SYSTEM', 'system')):
        assert from_environment({'MMEFFVIT_MALLOC': value}).malloc == malloc


def test_context_managers_nest_and_restore():
    base = policy()
    with use_reference():
        assert policy().mode == 'reference' and ops.get_ext(torch.zeros(1)) is None
        with use_kernels(required=False, cpu_gemm='aten'):
            assert (policy().mode, policy().cpu_gemm) == ('auto', 'aten')
            with use_reference():
                assert (policy().mode, policy().cpu_gemm) == ('reference', 'aten')
            assert policy().mode == 'auto'
        assert (policy().mode, policy().cpu_gemm) == ('reference', base.cpu_gemm)
    assert policy() is base
    with pytest.raises(KeyError):  # an error inside a block still restores the policy
        with use_kernels(required=False, cpu_gemm='aten'):
            raise KeyError
    assert policy() is base


def test_both_paths_taken(monkeypatch):
    """The same call runs the reference under use_reference() and the compiled kernel under
    use_kernels() (where built), with the same result."""
    from mmeffvit.ops import focus as focus_module
    calls = []
    reference = focus_module.focus_feature_map_ref
    monkeypatch.setattr(focus_module, 'focus_feature_map_ref',
                        lambda *a, **k: calls.append('reference') or reference(*a, **k))
    x, scale = torch.randn(2, 5, 8), torch.randn(8)
    with use_reference():
        ref = ops.focus_feature_map(x, scale)
    assert calls == ['reference']
    if ops.load_ext() is None:
        with pytest.raises(RuntimeError, match='not built'), use_kernels():
            ops.focus_feature_map(x, scale)
        return
    with use_kernels():
        out = ops.focus_feature_map(x, scale)
    assert calls == ['reference']  # the kernel ran
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(ops.load_ext() is None, reason='mmeffvit._ext is not built')
@pytest.mark.parametrize('forced, kernel_gemm', [('aten', 'blas'), ('onednn', 'brgemm')])
def test_policy_drives_and_restores_the_extension_gemm(forced, kernel_gemm):
    """The C++ block products follow the policy: chosen, the GEMM that goes with the linears';
    unset, the C++ rule (brgemm on AVX-512); the state before a block is restored after it.
    ``set_cpu_gemm`` returns the GEMM in use."""
    if forced == 'onednn' and not policy_module.ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    ext = ops.load_ext()
    before = ext.set_cpu_gemm('auto')
    try:
        try:
            ext.set_cpu_gemm('brgemm')
        except RuntimeError:
            pytest.skip('this torch has no fp32 brgemm: one GEMM, nothing to switch')
        other = 'blas' if kernel_gemm == 'brgemm' else 'brgemm'
        ext.set_cpu_gemm(other)  # start from the other GEMM, so that the switch is seen
        with use_kernels(cpu_gemm=forced):
            assert ext.set_cpu_gemm(kernel_gemm) == kernel_gemm
            with use_reference():  # keeps the chosen GEMM
                assert ext.set_cpu_gemm(kernel_gemm) == kernel_gemm
        assert ext.set_cpu_gemm(other) == other  # restored
        policy_module.apply_to_extension(ext, from_environment({}))
        avx512 = policy().cpu_capability.startswith('AVX512')
        assert ext.set_cpu_gemm('auto') == ('brgemm' if avx512 else 'blas')
    finally:
        ext.set_cpu_gemm(before)
    assert policy_module.apply_to_extension(None) is None


def test_module_prints_the_policy():
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    env.update(MMEFFVIT_OPS='0', MMEFFVIT_LINEAR_KERNEL='aten')
    out = subprocess.run([sys.executable, '-m', 'mmeffvit.ops.policy'], cwd=REPO, env=env,
                         capture_output=True, text=True, check=True).stdout
    assert 'mmeffvit kernel policy' in out
    assert re.search(r'operators\s+reference\s+MMEFFVIT_OPS=0', out), out
    assert re.search(r'CPU GEMM\s+aten\s+MMEFFVIT_LINEAR_KERNEL=aten', out), out
    assert re.search(r"kernels' GEMM\s+blas", out), out
    assert re.search(r'allocator\s+default\s+MMEFFVIT_MALLOC unset', out), out
    assert re.search(r'extension\s+mmeffvit\._ext\s+(built|not built)', out), out


KERNEL_READ = re.compile(r"""(environ|getenv)\b.{0,40}['"]MMEFFVIT_(OPS|LINEAR_KERNEL|MALLOC)""")
KERNEL_WRITE = re.compile(r"""setenv\(['"]MMEFFVIT_(OPS|LINEAR_KERNEL|MALLOC)|"""
                          r"""environ\[['"]MMEFFVIT_(OPS|LINEAR_KERNEL|MALLOC)['"]\]\s*=|"""
                          r"""setattr\(\w+, ['"]LINEAR_KERNEL['"]""")


def test_only_the_policy_reads_kernel_variables():
    """Only ``ops/policy`` reads the kernel switches; nothing under mmeffvit/, tools/analysis/
    or tests/ writes them to choose a path (the context managers do)."""
    readers = []
    writers = []
    for folder in ('mmeffvit', osp.join('tools', 'analysis'), 'tests'):
        for root, _, files in os.walk(osp.join(REPO, folder)):
            for name in files:
                if name.endswith('.py'):
                    path = osp.join(root, name)
                    with open(path, encoding='utf-8') as f:
                        text = f.read()
                    if KERNEL_READ.search(text) and folder != 'tests':
                        readers.append(osp.relpath(path, REPO))
                    if KERNEL_WRITE.search(text) and path != osp.abspath(__file__):
                        writers.append(osp.relpath(path, REPO))
    assert readers == ['mmeffvit/ops/policy/__init__.py']
    assert writers == []
    # the checks see what they look for
    assert KERNEL_READ.search("os.environ.get('MMEFFVIT_LINEAR_KERNEL', '')")
    assert KERNEL_WRITE.search("monkeypatch.setenv('MMEFFVIT_OPS', '1')")
    assert KERNEL_WRITE.search("os.environ['MMEFFVIT_OPS'] = '0'")
    assert KERNEL_WRITE.search("monkeypatch.setattr(linear, 'LINEAR_KERNEL', 'onednn')")


def test_reference_on_a_cuda_tensor_is_logged_once(monkeypatch):
    """Auto mode on a CUDA tensor (a fake one: no GPU needed) takes the reference and says so
    once per process."""
    import importlib

    from torch._subclasses.fake_tensor import FakeTensorMode
    loader = importlib.import_module('mmeffvit.ops.ext_loader')
    monkeypatch.setattr(loader, '_logged', False)
    logged = []
    monkeypatch.setattr('mmengine.logging.print_log', lambda msg, **kw: logged.append(msg))
    with FakeTensorMode():
        cuda = torch.empty(2, device='cuda')
    with ops.use_kernels(required=False):
        assert loader.get_ext(cuda) is None and loader.get_ext(cuda) is None
    assert len(logged) == 1 and 'PyTorch reference' in logged[0]
