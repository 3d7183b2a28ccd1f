"""Activation recompute changes memory, never the arithmetic: weights trained with every stage
recomputing equal those trained without, under every schedule on 2 and 4 workers. The runs take
SGD steps (momentum 0.9) at learning rate 1: the first moves a weight by its whole gradient, the
second by the next gradient plus 0.9 of the first, so weights equal within 1e-5 are gradients
equal within that."""

import pytest

from pipeboard.trainer.runtime import RunConfig, run_training
from pipeboard.trainer.runtime import stage_modules
from pipeboard.trainer.runtime.checkpoint import assemble_model
from pipeboard.trainer.runtime.run_config import ConfigError
from tests.trainer.params import max_diff
from tests.trainer.schedule_runs import MLP

SCHEDULES = [("gpipe", {}), ("1f1b", {}), ("pipedream", {}), ("zb-h1", {}), ("interleaved-1f1b", {"chunks": 2})]


def trained(tmp_path, schedule, workers, recompute, **options):
    cfg = RunConfig(model="mlp", model_args=MLP, batch_size=16, microbatches=8, checkpoint_dir=str(tmp_path),
                    eval_at_end=False, schedule=schedule, num_stages=workers, steps=2, optimizer="sgd", lr=1.0,
                    recompute=recompute, **options)
    assert run_training(cfg)["steps"] == 2
    model, _ = assemble_model(cfg, tmp_path)
    return model


def initial(tmp_path, schedule, workers, **options):
    """The model those runs started from (the task's, built as the runtime builds it)."""
    cfg = RunConfig(model="mlp", model_args=MLP, batch_size=16, microbatches=8, checkpoint_dir=str(tmp_path),
                    schedule=schedule, num_stages=workers, **options)
    return stage_modules.load_task(cfg).model


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("schedule,options", SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_recompute_trains_the_same_weights(tmp_path, schedule, options, workers):
    stages = workers * options.get("chunks", 1)
    plain = trained(tmp_path / "plain", schedule, workers, None, **options)
    redone = trained(tmp_path / "redone", schedule, workers, list(range(stages)), **options)
    assert max_diff(plain, redone) < 1e-5
    assert max_diff(plain, initial(tmp_path / "plain", schedule, workers, **options)) > 1e-3  # the steps moved them


def test_a_recompute_stage_outside_the_run_is_one_clear_error():
    cfg = RunConfig(model="mlp", model_args=MLP, batch_size=16, microbatches=8, schedule="gpipe", num_stages=2,
                    steps=1, recompute=[2])
    with pytest.raises(ConfigError, match=r"recompute: stage 2 is not a stage of this run \(0..1\)"):
        cfg.validate()


def test_a_recomputing_stage_reruns_its_forward_in_the_backward():
    import torch

    from pipeboard.trainer.runtime.stage import Stage

    def forwards(recompute):
        calls = []

        class Counting(torch.nn.Module):  # counts its runs (forward hooks do not fire in a recompute)
            def __init__(self):
                super().__init__()
                self.first, self.second = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

            def forward(self, x):
                calls.append(1)
                return self.second(torch.tanh(self.first(x)))

        torch.manual_seed(0)
        module = Counting()
        stage = Stage(0, module, torch.optim.SGD(module.parameters(), lr=0.1), is_first=True, is_last=False,
                      loss_fn=None, stash=False, loss_scale=1.0, layer_calls=False, recompute=recompute)
        (out,) = stage.forward(0, 0, [torch.randn(3, 4)], None)
        stage.backward(0, [torch.ones_like(out)])
        return len(calls), [p.grad.clone() for p in module.parameters()]

    (plain_calls, plain_grads), (redo_calls, redo_grads) = forwards(False), forwards(True)
    assert (plain_calls, redo_calls) == (1, 2)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain_grads, redo_grads))


def test_the_train_cli_takes_recompute_and_refuses_a_bad_value_in_one_line():
    import subprocess
    import sys

    cli = [sys.executable, "-c", "from pipeboard.app.cli import main; main()", "train", "--model", "mlp",
           "--model-arg", "depth=2", "--model-arg", "width=32", "--model-arg", "samples=256", "--batch-size", "16",
           "--microbatches", "4", "--stages", "2", "--schedule", "1f1b", "--steps", "2", "--json"]
    ok = subprocess.run([*cli, "--recompute", "all"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    for bad, says in (("x", "recompute: all, none or stage numbers"), ("5", "recompute: stage 5 is not a stage")):
        r = subprocess.run([*cli, "--recompute", bad], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
