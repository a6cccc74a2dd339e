"""Install mmeffvit; builds the C++/CUDA operators ``mmeffvit._ext`` unless MMEFFVIT_WITH_OPS=0.

Environment: MMEFFVIT_WITH_OPS=0 skips the extension (the ops then fall back to PyTorch),
FORCE_CUDA=1 builds the CUDA kernels without a visible GPU (TORCH_CUDA_ARCH_LIST selects the
architectures), MAX_JOBS bounds the parallel compile jobs (read by torch's BuildExtension).

A regular install (``pip install .``, a wheel) also puts ``configs/``, ``tools/`` and
``model-index.yml`` into ``mmeffvit/.mim/``, where ``mim search mmeffvit`` and
``mmeffvit.apis`` find the model index of an installed OpenMMLab package. An editable install
(and ``python setup.py egg_info``) links them there instead, in the checkout (as mmdet's
``add_mim_extension`` does in develop mode); ``mmeffvit.apis`` reads the checkout itself.
mim looks in ``<distribution location>/mmeffvit/.mim``: a pip editable install (PEP 660) records
``site-packages`` as that location, so mim sees the checkout's links only through a
``mmeffvit.egg-info`` in the checkout (``python setup.py egg_info``) with the checkout first on
``sys.path`` (``python -m mim search mmeffvit`` run from it): see ``configs/README.md``.
"""
import glob
import os
import shutil
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

#: what an installed package carries for mim, relative to the repository root
MIM_FILES = ('configs', 'tools', 'model-index.yml')


class BuildWithMimFiles(build_py):
    """``build_py`` that also copies :data:`MIM_FILES` into ``<build>/mmeffvit/.mim``.

    Written into the build tree only (the checkout is left untouched), so every wheel has them;
    skipped for editable installs, whose package directory is the checkout.
    """

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            link_mim_files()
            return
        root = os.path.dirname(os.path.abspath(__file__))
        target = os.path.join(self.build_lib, 'mmeffvit', '.mim')
        ignore = shutil.ignore_patterns('__pycache__', '*.pyc')
        for name in MIM_FILES:
            src, dst = os.path.join(root, name), os.path.join(target, name)
            if os.path.isdir(dst):
                shutil.rmtree(dst)
            if os.path.isdir(src):
                shutil.copytree(src, dst, ignore=ignore)
            elif os.path.isfile(src):
                os.makedirs(target, exist_ok=True)
                shutil.copyfile(src, dst)
            else:
                raise FileNotFoundError(f'{src} is missing: mim needs it in mmeffvit/.mim')


def link_mim_files():
    """Relative links ``mmeffvit/.mim/<name> -> ../../<name>`` in the checkout (git-ignored),
    for installs whose package directory is the checkout; a copy where links are refused."""
    root = os.path.dirname(os.path.abspath(__file__))
    target = os.path.join(root, 'mmeffvit', '.mim')
    os.makedirs(target, exist_ok=True)
    for name in MIM_FILES:
        src, dst = os.path.join(root, name), os.path.join(target, name)
        if os.path.islink(dst) or os.path.isfile(dst):
            os.remove(dst)
        elif os.path.isdir(dst):
            shutil.rmtree(dst)
        try:
            os.symlink(os.path.relpath(src, target), dst)
        except OSError:
            (shutil.copytree if os.path.isdir(src) else shutil.copyfile)(src, dst)


def ext_modules():
    if os.environ.get('MMEFFVIT_WITH_OPS', '1') == '0':
        return [], {}
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    root = os.path.join('mmeffvit', 'ops', 'csrc')
    sources = sorted(glob.glob(os.path.join(root, 'pytorch', '*.cpp')) +
                     glob.glob(os.path.join(root, 'pytorch', 'cpu', '*.cpp')))
    # torch >= 2.10 headers need C++20; an explicit -std also stops torch adding -std=c++17.
    # at::parallel_for is inline OpenMP: without -fopenmp the CPU kernels silently run on one
    # thread (measured: no speed-up from 1 to 2 threads). torch's own libgomp is the one loaded.
    args = {'cxx': ['-O3', '-std=c++20', '-fopenmp']}
    link = ['-fopenmp']
    include = [os.path.abspath(os.path.join(root, 'common'))]
    if torch.cuda.is_available() or os.environ.get('FORCE_CUDA') == '1':
        sources += sorted(glob.glob(os.path.join(root, 'pytorch', 'cuda', '*.cu')))
        args['cxx'].append('-DWITH_CUDA')
        args['nvcc'] = ['-O3', '-std=c++20', '-DWITH_CUDA', '--expt-relaxed-constexpr']
        ext = CUDAExtension('mmeffvit._ext', sources, include_dirs=include,
                            extra_compile_args=args, extra_link_args=link)
    else:
        ext = CppExtension('mmeffvit._ext', sources, include_dirs=include,
                           extra_compile_args=args, extra_link_args=link)
    return [ext], {'build_ext': BuildExtension}


if {'egg_info', 'develop'} & set(sys.argv[1:]):
    link_mim_files()
exts, cmdclass = ext_modules()
setup(name='mmeffvit', version='0.1.0',
      packages=find_packages(include=['mmeffvit', 'mmeffvit.*']),
      ext_modules=exts, cmdclass=dict(cmdclass, build_py=BuildWithMimFiles), zip_safe=False)
