"""Mixed precision of every family under CPU autocast, bf16 and fp16, against its own fp32
forward and backward within the bounds of ``tests/amp_check.py``.

The default run checks the small configurations of ``test_backbone_contract`` at 97×131 for
the families whose own test file has no autocast check (the FLatten PVTv2, Swin, CSWin and
DeiT variants); the family files check FLatten-PVT, LaViT, Focal, CARE and L²ViT. Marked slow:
every family at a dense size, at least 16k stage-1 tokens (512×512 at stride 4, DeiT's 16k
tokens at stride 16), where sums over tokens are long enough for low-precision accumulation to
show.
"""
import pytest
import torch
from amp_check import AMP_DTYPES, check_autocast_against_fp32

from test_backbone_contract import NAMES, build

DENSE = {name: (512, 512) for name in NAMES}
DENSE['FLattenDeiT'] = (2048, 2048)  # 128² = 16k tokens at stride 16
STAGE_1_STRIDE = {'FLattenDeiT': 16}


@pytest.mark.parametrize('dtype', AMP_DTYPES)
@pytest.mark.parametrize('name', ['FLattenPVTv2', 'FLattenSwin', 'FLattenCSWin', 'FLattenDeiT'])
def test_autocast_small(name, dtype):
    torch.manual_seed(0)
    check_autocast_against_fp32(build(name, drop_path_rate=0.), torch.rand(1, 3, 97, 131), dtype)


@pytest.mark.slow
@pytest.mark.parametrize('dtype', AMP_DTYPES)
@pytest.mark.parametrize('name', NAMES)
def test_autocast_at_a_dense_size(name, dtype):
    hw = DENSE[name]
    stride = STAGE_1_STRIDE.get(name, 4)
    assert (hw[0] // stride) * (hw[1] // stride) >= 16384
    torch.manual_seed(0)
    check_autocast_against_fp32(build(name, drop_path_rate=0.), torch.rand(1, 3, *hw), dtype)
