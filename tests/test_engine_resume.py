"""Fast checks of mmeffvit.engine's resume pieces: checkpoint choice, generator states, hooks."""
import random
import types

import numpy as np
import pytest
import torch
from mmengine.config import Config

from mmeffvit.engine import launch
from mmeffvit.engine.hooks import (NonFiniteLossError, NonFiniteLossHook, ResumeStateHook,
                                   capture_rng_state, restore_rng_state)
from mmeffvit.engine.resume import checkpoint_problem, find_resume_checkpoint


def _draws():
    return (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist(),
            torch.nn.functional.dropout(torch.ones(8), 0.5).tolist())


def test_rng_state_round_trip_through_a_weights_only_file(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1), np.random.randn()  # leave cached gaussians in both states
    state = capture_rng_state()
    expected = _draws()
    torch.save(dict(resume_state=state), str(tmp_path / 's.pth'))
    loaded = torch.load(str(tmp_path / 's.pth'), weights_only=True)['resume_state']
    _draws()
    restore_rng_state(loaded)
    assert _draws() == expected


def _save(path, step):
    torch.save(dict(meta=dict(iter=step), w=torch.arange(1000.)), str(path))
    return str(path)


def test_checkpoint_problem(tmp_path):
    good = _save(tmp_path / 'good.pth', 1)
    assert checkpoint_problem(good) is None
    data = open(good, 'rb').read()
    (tmp_path / 'cut.pth').write_bytes(data[:len(data) // 2])
    assert 'truncated' in checkpoint_problem(str(tmp_path / 'cut.pth'))
    (tmp_path / 'empty.pth').write_bytes(b'')
    assert '0 bytes' in checkpoint_problem(str(tmp_path / 'empty.pth'))
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    (tmp_path / 'flip.pth').write_bytes(bytes(flipped))
    assert 'checksum' in checkpoint_problem(str(tmp_path / 'flip.pth'))
    assert 'does not exist' in checkpoint_problem(str(tmp_path / 'none.pth'))


def test_resume_falls_back_to_newest_intact(tmp_path):
    for step in (2, 4):
        _save(tmp_path / f'iter_{step}.pth', step)
    latest = tmp_path / 'iter_6.pth'
    latest.write_bytes(open(tmp_path / 'iter_4.pth', 'rb').read()[:300])  # truncated
    (tmp_path / 'last_checkpoint').write_text(str(latest))
    path, notes = find_resume_checkpoint(str(tmp_path))
    assert path == str(tmp_path / 'iter_4.pth')
    assert 'iter_6.pth' in notes[0] and 'truncated' in notes[0]
    assert 'newest intact' in notes[-1]
    # last_checkpoint names a file that is gone: same fallback
    latest.unlink()
    path, notes = find_resume_checkpoint(str(tmp_path))
    assert path == str(tmp_path / 'iter_4.pth') and 'does not exist' in notes[0]
    # intact: taken as it is, silently
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_2.pth'))
    assert find_resume_checkpoint(str(tmp_path)) == (str(tmp_path / 'iter_2.pth'), [])


def test_killed_during_first_save_starts_fresh(tmp_path):
    (tmp_path / 'iter_2.pth').write_bytes(b'PK\x03\x04partial')  # no last_checkpoint yet
    path, notes = find_resume_checkpoint(str(tmp_path))
    assert path is None and 'starts from the beginning' in notes[-1]
    cfg = Config(dict(work_dir=str(tmp_path), load_from='init.pth'))
    args = types.SimpleNamespace(amp=False, auto_scale_lr=False, resume='auto')
    launch.apply_train_args(cfg, args)
    assert cfg.resume is False and cfg.load_from == 'init.pth'
    assert path is None and not any('None' in n for n in notes)


def test_explicit_resume_of_a_truncated_file_is_refused(tmp_path):
    (tmp_path / 'iter_2.pth').write_bytes(b'PK\x03\x04partial')
    cfg = Config(dict(work_dir=str(tmp_path)))
    args = types.SimpleNamespace(amp=False, auto_scale_lr=False,
                                 resume=str(tmp_path / 'iter_2.pth'))
    with pytest.raises(launch.ConfigError, match='iter_2.pth: the file is truncated'):
        launch.apply_train_args(cfg, args)


def _runner(it=4, epoch=0):
    logs = []
    logger = types.SimpleNamespace(warning=logs.append, info=logs.append)
    return types.SimpleNamespace(iter=it, epoch=epoch, logger=logger, hooks=[]), logs


@pytest.mark.parametrize('value', [float('nan'), float('inf'), -float('inf')])
def test_non_finite_loss_stops_with_iteration_and_name(value):
    runner, _ = _runner(it=6)
    outputs = dict(loss=torch.tensor(value), loss_cls=torch.tensor(0.5),
                   loss_mask=torch.tensor(value), acc=torch.tensor(value))
    with pytest.raises(NonFiniteLossError) as err:
        NonFiniteLossHook().after_train_iter(runner, 6, outputs=outputs)
    message = str(err.value)
    assert 'iteration 7' in message and f'loss_mask={value}' in message
    assert 'loss_cls' not in message and 'acc' not in message
    NonFiniteLossHook().after_train_iter(runner, 6, outputs=dict(loss=torch.tensor(1.0)))


def test_validation_leaves_the_training_stream_alone():
    hook = ResumeStateHook()
    runner, _ = _runner()
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    hook.before_val(runner)
    torch.rand(5)  # what a validation draws
    hook.after_val(runner)
    assert torch.equal(torch.rand(2), expected)


def test_old_checkpoint_without_state_warns():
    hook = ResumeStateHook()
    runner, logs = _runner(it=4)
    hook.after_load_checkpoint(runner, dict(meta=dict(iter=4, epoch=0)))
    hook.before_train(runner)
    assert any('no random generator states' in m for m in logs)
    # load_from (weights only) leaves a fresh run alone
    runner, logs = _runner(it=0)
    hook.after_load_checkpoint(runner, dict(meta=dict(iter=4, epoch=0)))
    hook.before_train(runner)
    assert logs == []


# --- in-process runs of mmengine's Runner: both loop types, validation in between --------------

def _toy_runner(work_dir, loop, name, resume_from=None, losses=None):
    from mmengine.evaluator import BaseMetric, Evaluator
    from mmengine.hooks import Hook
    from mmengine.model import BaseModel
    from mmengine.runner import Runner
    from torch.utils.data import Dataset

    class Net(BaseModel):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, inputs, target, mode='tensor'):
            pred = self.fc(self.drop(inputs)).squeeze(-1)
            return dict(loss=((pred - target) ** 2).mean()) if mode == 'loss' else [pred]

    class Noisy(Dataset):  # numpy and python random "augmentation"
        def __len__(self):
            return 6

        def __getitem__(self, i):
            x = torch.full((4, ), float(i)) + torch.from_numpy(np.random.rand(4)).float()
            return dict(inputs=x * random.uniform(0.5, 1.5), target=torch.tensor(float(i)))

    class Metric(BaseMetric):
        def process(self, data_batch, data_samples):
            self.results.append(0.0)

        def compute_metrics(self, results):
            return dict(zero=0.0)

    class Record(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            losses[runner.iter + 1] = outputs['loss'].item()

    def loader(shuffle):
        return dict(batch_size=2, num_workers=0, dataset=Noisy(),
                    sampler=dict(type='DefaultSampler', shuffle=shuffle),
                    collate_fn=dict(type='default_collate'))

    by_epoch = loop == 'EpochBasedTrainLoop'
    train_cfg = dict(type=loop, val_interval=1 if by_epoch else 3,
                     **(dict(max_epochs=3) if by_epoch else dict(max_iters=9)))
    return Runner(
        model=Net(), work_dir=str(work_dir), experiment_name=name,
        train_dataloader=loader(True), val_dataloader=loader(False),
        val_evaluator=Evaluator(Metric()), train_cfg=train_cfg, val_cfg=dict(),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1 if by_epoch else 3,
                                           by_epoch=by_epoch),
                           logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[ResumeStateHook(), Record()], randomness=dict(seed=0),
        resume=resume_from is not None, load_from=resume_from, default_scope='mmengine')


@pytest.mark.parametrize('loop, checkpoint, first_new', [
    ('IterBasedTrainLoop', 'iter_3.pth', 4), ('EpochBasedTrainLoop', 'epoch_1.pth', 4)])
def test_resumed_toy_run_repeats_the_uninterrupted_one(tmp_path, loop, checkpoint, first_new):
    reference, resumed = {}, {}
    _toy_runner(tmp_path / 'a', loop, f'ref_{loop}', losses=reference).train()
    ckpt = str(tmp_path / 'a' / checkpoint)
    _toy_runner(tmp_path / 'b', loop, f'res_{loop}', resume_from=ckpt, losses=resumed).train()
    assert len(reference) == 9 and sorted(resumed) == list(range(first_new, 10))
    assert all(resumed[i] == reference[i] for i in resumed), (resumed, reference)
