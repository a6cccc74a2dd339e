"""CPUSyncBatchNorm on two gloo processes against plain BatchNorm on the concatenated batch."""
import json
import os
import os.path as osp
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS

from mmeffvit.engine.cpu_sync_bn import (CPUSyncBatchNorm, convert_sync_batchnorm_for_cpu,
                                         cpu_wrapper_type)

# uneven split: the statistics must weight each rank by its element count
SPLIT = (3, 1)


def _free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _reference():
    """Inputs, upstream gradients and plain BN's results on the whole batch (float64)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(sum(SPLIT), 3, 5, 4, generator=gen, dtype=torch.float64) * 3 + 1
    grad_out = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    bn = torch.nn.BatchNorm2d(3, momentum=0.3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.5, 1.5, -1.0]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    init = {k: v.clone() for k, v in bn.state_dict().items()}
    x_ref = x.clone().requires_grad_()
    y = bn(x_ref)
    (y * grad_out).sum().backward()
    return x, grad_out, init, dict(y=y.detach(), x_grad=x_ref.grad, w_grad=bn.weight.grad,
                                   b_grad=bn.bias.grad, state=bn.state_dict())


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=2)
    x, grad_out, init, ref = _reference()
    start = sum(SPLIT[:rank])
    rows = slice(start, start + SPLIT[rank])
    # a GPU-style model: SyncBN, converted as the CPU DDP wrapper does
    model = torch.nn.Sequential(torch.nn.SyncBatchNorm(3, momentum=0.3)).double()
    model[0].load_state_dict(init)
    model = convert_sync_batchnorm_for_cpu(model)
    bn = model[0]
    x_local = x[rows].clone().requires_grad_()
    y = model(x_local)
    (y * grad_out[rows]).sum().backward()
    w_grad, b_grad = bn.weight.grad.clone(), bn.bias.grad.clone()
    dist.all_reduce(w_grad)  # DDP's bucket reduction, as a sum of the ranks' losses
    dist.all_reduce(b_grad)
    checks = dict(
        type=type(bn).__name__, keys=sorted(model.state_dict()),
        y=torch.allclose(y, ref['y'][rows], atol=1e-10),
        x_grad=torch.allclose(x_local.grad, ref['x_grad'][rows], atol=1e-10),
        w_grad=torch.allclose(w_grad, ref['w_grad'], atol=1e-10),
        b_grad=torch.allclose(b_grad, ref['b_grad'], atol=1e-10),
        running=all(torch.allclose(bn.state_dict()[k].double(), ref['state'][k].double(),
                                   atol=1e-10) for k in ref['state']),
        # eval mode: running statistics, no communication
        eval=torch.allclose(bn.eval()(x[rows]), torch.nn.functional.batch_norm(
            x[rows], ref['state']['running_mean'], ref['state']['running_var'],
            bn.weight, bn.bias, False, 0.0, bn.eps), atol=1e-10))
    # DDP accepts the converted CPU model (it refuses torch's SyncBN on CPU)
    wrapper = MODEL_WRAPPERS.build(dict(type=cpu_wrapper_type(MMDistributedDataParallel),
                                        module=torch.nn.Sequential(torch.nn.SyncBatchNorm(3)),
                                        device_ids=None))
    checks['ddp'] = isinstance(wrapper.module[0], CPUSyncBatchNorm)
    dist.destroy_process_group()
    with open(osp.join(out_dir, f'rank{rank}.json'), 'w') as f:
        json.dump(checks, f)


def test_forward_backward_match_batch_norm_on_the_whole_batch(tmp_path, monkeypatch):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2)
    for rank in range(2):
        checks = json.loads((tmp_path / f'rank{rank}.json').read_text())
        assert checks.pop('type') == 'CPUSyncBatchNorm'
        assert checks.pop('keys') == ['0.bias', '0.num_batches_tracked', '0.running_mean',
                                      '0.running_var', '0.weight']
        assert all(checks.values()), (rank, checks)


def test_without_process_group_it_is_batch_norm():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 6, 6)
    sync, plain = CPUSyncBatchNorm(3), torch.nn.BatchNorm2d(3)
    assert torch.equal(sync(x), plain(x))
    assert torch.equal(sync.running_var, plain.running_var)
    with pytest.raises(ValueError, match='2D'):
        sync(torch.randn(3))


def test_conversion_keeps_flags_and_mode():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.SyncBatchNorm(4))
    model[1].weight.requires_grad_(False)
    model.eval()
    converted = convert_sync_batchnorm_for_cpu(model)
    assert isinstance(converted[1], CPUSyncBatchNorm) and not converted[1].training
    assert not converted[1].weight.requires_grad and converted[1].bias.requires_grad
    assert converted[0] is model[0]
