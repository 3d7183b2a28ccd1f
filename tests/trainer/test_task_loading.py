"""The data order every stage reproduces: each sample once per epoch, the last partial batch
dropped, a resumed stream starting at its batch; a last stage reads targets without inputs."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, TensorDataset

from pipeboard.trainer.runtime.data import TrainStream, ValStream
from pipeboard.trainer.task import Task
from pipeboard.trainer.task.loading import EpochBatches


def test_each_sample_once_per_epoch_and_the_partial_batch_dropped():
    sampler = EpochBatches(size=70, batch_size=16, seed=3, epoch=2)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 4 and all(len(b) == 16 for b in batches)
    seen = [i for b in batches for i in b]
    assert len(set(seen)) == 64 and set(seen) <= set(range(70))
    sampler.set_epoch(2, start=2)
    assert list(sampler) == batches[2:]  # a resumed run reads nothing it skips
    sampler.set_epoch(3)
    assert list(sampler) != batches


class Numbered(Dataset):
    """Item i is (i as an input row, i as a target); inputs count as expensive to read."""

    def __init__(self, n: int, with_target: bool) -> None:
        self.n, self.inputs_read = n, 0
        if with_target:
            self.target = lambda i: torch.tensor(i)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.inputs_read += 1
        return torch.full((3,), float(i)), torch.tensor(i)


def _task(data) -> Task:
    return Task(model=torch.nn.Linear(3, 1), train_data=data, val_data=data, loss=torch.nn.functional.mse_loss,
                loader_workers=0, seed=5)


def test_first_and_last_stage_agree_on_every_microbatch_and_the_last_reads_no_inputs():
    full, targets_only = Numbered(40, True), Numbered(40, True)
    first = TrainStream(_task(full), 8, 4, torch.device("cpu"))
    last = TrainStream(_task(targets_only), 8, 4, torch.device("cpu"), inputs=False)
    for g in range(4 * 7):  # past one epoch (5 steps of 8)
        x, y = first.microbatch(g)
        _, y_last = last.microbatch(g)
        assert torch.equal(y, y_last) and torch.equal(x[:, 0].long(), y)
    assert full.inputs_read > 0 and targets_only.inputs_read == 0
    val = ValStream(_task(Numbered(10, True)), 4, torch.device("cpu"), inputs=False)
    assert len(val) == 3 and val.count == 10
    assert torch.equal(torch.cat([val.microbatch(j)[1] for j in range(3)])[:10], torch.arange(10))


def test_a_data_set_without_target_is_read_whole():
    data = Numbered(40, False)
    TrainStream(_task(data), 8, 4, torch.device("cpu"), inputs=False).microbatch(0)
    assert data.inputs_read == 8


def test_tensor_data_and_tuple_inputs():
    xs, ids = torch.randn(20, 3), torch.arange(20)
    data = TensorDataset(xs, ids, ids.float())
    task = Task(model=torch.nn.Linear(3, 1), train_data=_Pairs(data), loss=torch.nn.functional.mse_loss,
                loader_workers=0)
    (x, i), y = TrainStream(task, 8, 2, torch.device("cpu")).microbatch(1)
    assert x.shape == (4, 3) and torch.equal(y, i.float()) and torch.equal(xs[i], x)


class _Pairs(Dataset):
    """(input tuple, target) from a three-tensor data set."""

    def __init__(self, data) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        x, i_, y = self.data[i]
        return (x, i_), y


def test_the_shipped_data_sets_give_the_same_targets_alone():
    from pipeboard.trainer.task.datasets import text_windows_of

    train, val = text_windows_of("the quick brown fox jumps over the lazy dog " * 20, 16)
    for data in (train, val):
        for i in range(len(data)):
            assert torch.equal(data.target(i), data[i][1])
