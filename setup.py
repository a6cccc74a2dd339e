"""Install mmeffvit; builds the C++/CUDA operators ``mmeffvit._ext`` unless MMEFFVIT_WITH_OPS=0.

Environment: MMEFFVIT_WITH_OPS=0 skips the extension (the ops then fall back to PyTorch),
FORCE_CUDA=1 builds the CUDA kernels without a visible GPU (TORCH_CUDA_ARCH_LIST selects the
architectures), MAX_JOBS bounds the parallel compile jobs (read by torch's BuildExtension).
"""
import glob
import os

from setuptools import find_packages, setup


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


exts, cmdclass = ext_modules()
setup(name='mmeffvit', version='0.1.0',
      packages=find_packages(include=['mmeffvit', 'mmeffvit.*']),
      ext_modules=exts, cmdclass=cmdclass, zip_safe=False)
