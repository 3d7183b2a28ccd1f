"""The runtime's workers train with the Python heap of their set-up frozen (worker.freeze_heap),
forked or spawned, and the launcher leaves its caller's collector as it found it."""

from __future__ import annotations

import gc
import textwrap
import weakref

import pytest

from pipeboard.trainer.runtime import RunConfig, run_training
from pipeboard.trainer.runtime.worker_process import freeze_heap

# A loss that fails where the objects alive before training are still walked by every collection
# (the last stage's worker; the launcher checks the task with it too): the run then fails with its message.
TASK = textwrap.dedent('''
    import gc

    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from pipeboard.trainer import Task


    def in_a_worker():
        with open("/proc/self/comm") as f:  # workers name themselves pipeboard-rN
            return f.read().startswith("pipeboard-r")


    def frozen_loss(out, y):
        if in_a_worker() and gc.get_freeze_count() == 0:
            raise RuntimeError("training with an unfrozen heap")
        return nn.functional.cross_entropy(out, y)


    def make():
        torch.manual_seed(0)
        x, y = torch.randn(64, 8), torch.randint(0, 8, (64,))
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        return Task(model=model, train_data=TensorDataset(x, y), loss=frozen_loss)
''')


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "frozen.py"
    path.write_text(TASK)
    return str(path)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_workers_train_with_their_set_up_frozen_and_the_caller_is_left_unfrozen(task_file, start_method):
    assert gc.get_freeze_count() == 0
    cfg = RunConfig(model=f"{task_file}:make", stages=[["input_1", "0", "1"], ["2"]], schedule="1f1b", batch_size=16,
                    microbatches=2, steps=3, eval_at_end=False, start_method=start_method)
    summary = run_training(cfg)
    assert summary["steps"] == 3
    assert gc.get_freeze_count() == 0  # pytest's own objects stay collectable


def test_freeze_heap_collects_then_freezes_what_is_alive() -> None:
    class Cycle:
        pass

    garbage = Cycle()
    garbage.me = garbage  # only a collection frees it
    gone = weakref.ref(garbage)
    del garbage
    kept = Cycle()
    try:
        freeze_heap()
        assert gone() is None
        assert gc.get_freeze_count() > 0 and not any(o is kept for o in gc.get_objects())  # frozen: not walked
        gc.unfreeze()
        assert any(o is kept for o in gc.get_objects())
    finally:
        gc.unfreeze()
