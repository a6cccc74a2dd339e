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
from mmeffvit.ops.policy import KernelPolicy, choose_cpu_gemm, policy

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
KERNEL_VARIABLES = ('MMEFFVIT_OPS', 'MMEFFVIT_LINEAR_KERNEL', 'MMEFFVIT_MALLOC')


@pytest.fixture
def clean_env(monkeypatch):
    for name in KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults_follow_the_cpu(clean_env):
    p = policy()
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
def test_ops_switch(clean_env, ops_value, mode, cpu, cuda):
    clean_env.setenv('MMEFFVIT_OPS', ops_value)
    p = policy()
    assert (p.mode, p.ops_for('cpu'), p.ops_for('cuda')) == (mode, cpu, cuda)
    assert p.reference == (mode == 'reference') and p.cuda_kernels == (mode == 'kernels')
    assert ops.ops_mode() == {'reference': '0', 'auto': 'auto', 'kernels': '1'}[mode]


@pytest.mark.parametrize('forced, kernel_gemm', [('aten', 'blas'), ('onednn', 'brgemm')])
def test_forced_gemm(clean_env, forced, kernel_gemm):
    if forced == 'onednn' and not policy_module.ONEDNN_LINEAR:
        pytest.skip('this torch has no oneDNN linear kernel')
    clean_env.setenv('MMEFFVIT_LINEAR_KERNEL', forced)
    p = policy()
    assert (p.cpu_gemm, p.cpu_gemm_forced, p.kernel_gemm) == (forced, True, kernel_gemm)
    from mmeffvit.models.layers import linear
    assert linear.choose_linear_kernel() == forced  # the layers' reader delegates
    assert linear.choose_linear_kernel('AVX2') == forced  # the override wins over the ISA


@pytest.mark.parametrize('name, value', [('MMEFFVIT_OPS', '2'), ('MMEFFVIT_LINEAR_KERNEL', 'mkl'),
                                         ('MMEFFVIT_MALLOC', 'jemalloc')])
def test_unknown_values_are_clear_errors(clean_env, name, value):
    clean_env.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        policy()


@pytest.mark.parametrize('capability, override, expected', [
    ('AVX512', '', 'onednn'), ('AVX512_BF16', '', 'onednn'), ('AVX2', '', 'aten'),
    ('DEFAULT', '', 'aten'), ('AVX2', 'onednn', 'onednn'), ('AVX512', 'aten', 'aten')])
def test_cpu_gemm_rule(capability, override, expected):
    if expected == 'onednn' and not policy_module.ONEDNN_LINEAR:
        expected = 'aten'
    assert choose_cpu_gemm(capability, override) == expected


def test_malloc_setting_reaches_the_allocator(clean_env):
    for value, malloc in (('', 'default'), ('retain', 'retain'), ('SYSTEM', 'system')):
        clean_env.setenv('MMEFFVIT_MALLOC', value)
        assert policy().malloc == malloc


@pytest.mark.skipif(ops.load_ext() is None, reason='mmeffvit._ext is not built')
@pytest.mark.parametrize('forced, kernel_gemm', [('aten', 'blas'), ('onednn', 'brgemm')])
def test_policy_drives_the_extension_gemm(clean_env, forced, kernel_gemm):
    """The C++ block products follow the policy: forced, the GEMM that goes with the linears';
    unset, the C++ rule (brgemm on AVX-512). ``set_cpu_gemm`` returns the GEMM in use."""
    ext = ops.load_ext()
    before = ext.set_cpu_gemm('auto')
    try:
        try:
            ext.set_cpu_gemm('brgemm')
        except RuntimeError:
            pytest.skip('this torch has no fp32 brgemm: one GEMM, nothing to switch')
        other = 'blas' if kernel_gemm == 'brgemm' else 'brgemm'
        ext.set_cpu_gemm(other)  # start from the other GEMM, so that the switch is seen
        clean_env.setenv('MMEFFVIT_LINEAR_KERNEL', forced)
        if forced == 'onednn' and not policy_module.ONEDNN_LINEAR:
            pytest.skip('this torch has no oneDNN linear kernel')
        assert policy_module.apply_to_extension(ext) == other
        assert ext.set_cpu_gemm('auto') == kernel_gemm
        clean_env.delenv('MMEFFVIT_LINEAR_KERNEL')
        ext.set_cpu_gemm(other)
        policy_module.apply_to_extension(ext)
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


def test_only_the_policy_reads_kernel_variables():
    """The readers of the kernel switches delegate to ``ops/policy`` (``complexity.py`` and
    ``benchmark_ops.py`` switch paths by writing ``MMEFFVIT_OPS`` until the context managers
    of the next step replace that)."""
    readers = []
    for folder in ('mmeffvit', osp.join('tools', 'analysis')):
        for root, _, files in os.walk(osp.join(REPO, folder)):
            for name in files:
                if name.endswith('.py'):
                    path = osp.join(root, name)
                    with open(path, encoding='utf-8') as f:
                        if KERNEL_READ.search(f.read()):
                            readers.append(osp.relpath(path, REPO))
    assert sorted(readers) == ['mmeffvit/analysis/complexity.py',
                               'mmeffvit/ops/policy/__init__.py', 'tools/analysis/benchmark_ops.py']
    assert KERNEL_READ.search("os.environ.get('MMEFFVIT_LINEAR_KERNEL', '')")  # the check sees one
