"""A task that cannot train ends `pipeboard train` (and `profile`) with one line naming the
problem and exit code 2, before any worker starts."""

from __future__ import annotations

import textwrap

import pytest
from typer.testing import CliRunner

from pipeboard.app.cli import cli

TASKS = textwrap.dedent('''
    import torch
    from torch import nn
    from torch.utils.data import Dataset, TensorDataset
    from pipeboard.trainer import Task

    class Pairs(Dataset):
        def __init__(self, item):
            self.item = item
        def __len__(self):
            return 32
        def __getitem__(self, i):
            return self.item(i)

    def _task(data=None, loss=nn.functional.mse_loss, **kw):
        data = data or TensorDataset(torch.randn(32, 4), torch.randn(32, 2))
        return Task(model=nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), train_data=data, loss=loss, **kw)

    def good(width=8):
        return _task()

    def needs_data(data):
        return _task()

    def raises():
        raise RuntimeError("no GPU here, says the user's code")

    def wrong_type():
        return nn.Linear(4, 2)

    def not_pairs():
        return _task(Pairs(lambda i: torch.randn(4)))

    def triples():
        return _task(Pairs(lambda i: (torch.randn(4), torch.randn(2), 0)))

    def ragged():
        return _task(Pairs(lambda i: (torch.randn(4 if i < 5 else 3), torch.randn(2))))

    def per_sample_loss():
        return _task(loss=lambda out, y: ((out - y) ** 2).mean(dim=1))

    def loss_raises():
        return _task(loss=lambda out, y: nn.functional.cross_entropy(out, y.long()))

    def callable_metric_without_direction():
        return _task(val_data=TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), metric=lambda o, t: 0.0)
''')


@pytest.fixture()
def tasks(tmp_path):
    path = tmp_path / "bad_tasks.py"
    path.write_text(TASKS)
    return path


def _train(path, factory, *extra):
    log = path.parent / f"{factory}.jsonl"
    result = CliRunner().invoke(cli, ["train", "--model", f"{path}:{factory}", "--stages", "2", "--schedule", "1f1b",
                                      "--batch-size", "8", "--microbatches", "2", "--steps", "1",
                                      "--events-jsonl", str(log), *extra])
    return result, log


@pytest.mark.parametrize("factory,extra,words", [
    ("raises", [], ["task factory raised RuntimeError", "no GPU here", "bad_tasks.py:"]),
    ("wrong_type", [], ["returned Linear, not a pipeboard.trainer.Task"]),
    ("good", ["--model-arg", "colour=red"], ["model argument 'colour'", "takes no such argument", "width"]),
    ("good", ["--model-arg", "width=wide"], ["model argument 'width'", "integer"]),
    ("needs_data", ["--data", "/no/such/folder"], ["data:", "/no/such/folder", "does not exist"]),
    ("good", ["--data", "."], ["data:", "takes no data location"]),
    ("needs_data", [], ["data:", "needs a data location"]),
    ("missing_function", [], ["has no function 'missing_function'"]),
    ("not_pairs", [], ["train_data", "(input, target) pairs", "item 0 is a tensor of shape (4,)"]),
    ("triples", [], ["train_data", "(input, target) pairs", "3-tuple"]),
    ("ragged", [], ["train_data", "shapes disagree", "item 0's input is (4,), item 5's is (3,)"]),
    ("per_sample_loss", [], ["loss:", "scalar", "returned a tensor of shape (2,)"]),
    ("loss_raises", [], ["loss: raised", "on the model's output"]),
    ("callable_metric_without_direction", [], ["higher_is_better"]),
])
def test_bad_tasks_are_one_line_exit_2_and_start_no_worker(tasks, factory, extra, words):
    result, log = _train(tasks, factory, *extra)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not log.exists() or '"starting"' not in log.read_text()  # no worker was started


def test_a_missing_task_file_is_named(tmp_path):
    result = CliRunner().invoke(cli, ["profile", f"{tmp_path}/nope.py:make", "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "nope.py does not exist" in result.output, result.output


def test_the_good_task_trains(tasks):
    result, log = _train(tasks, "good", "--model-arg", "width=4")
    assert result.exit_code == 0, result.output
    assert '"starting"' in log.read_text()


def test_a_task_folder_does_not_shadow_the_standard_library(tmp_path):
    """A user's profile.py beside the task file must not replace the stdlib module that
    libraries import lazily later (transformers goes through cProfile -> profile)."""
    (tmp_path / "profile.py").write_text("raise ImportError('the user profile.py shadowed the stdlib')\n")
    (tmp_path / "helpers.py").write_text("WIDTH = 4\n")
    (tmp_path / "t.py").write_text(TASKS + "\nfrom helpers import WIDTH\n\ndef uses_sibling():\n    return good(WIDTH)\n")
    from pipeboard.trainer.spec import load_task

    import importlib.util

    load_task(f"{tmp_path}/t.py:uses_sibling")  # the sibling module imports
    assert importlib.util.find_spec("profile").origin != str(tmp_path / "profile.py")
