"""The runtime computes what the schedules promise: synchronous schedules equal single-process
gradient accumulation, pipedream equals a one-process emulation of weight stashing."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.params import max_diff
from pipeboard.trainer.runtime import RunConfig, run_training
from pipeboard.trainer.runtime.checkpoint import assemble_model
from pipeboard.trainer.runtime.reference import emulate_async, train_sync

SMALL = {"depth": 4, "width": 48, "samples": 512}



def run(tmp_path, microbatches=4, **kw):
    cfg = RunConfig(model="mlp", model_args=SMALL, batch_size=16, microbatches=microbatches,
                    checkpoint_dir=str(tmp_path), eval_at_end=False, **kw)
    summary = run_training(cfg)
    trained, states = assemble_model(cfg, tmp_path)
    return cfg, summary, trained, states


@pytest.mark.parametrize("schedule,stages,weight_grads", [
    ("gpipe", 2, "batched"), ("1f1b", 2, "batched"), ("1f1b", 3, "batched"), ("gpipe", 3, "batched"),
    ("interleaved-1f1b", 2, "batched"), ("1f1b", 2, "immediate"), ("gpipe", 3, "immediate"),
    ("zb-h1", 2, "batched"), ("zb-h1", 3, "batched"),  # zb-h1: its own BI and W per microbatch
])
def test_sync_schedules_equal_gradient_accumulation(tmp_path, schedule, stages, weight_grads):
    cfg, summary, trained, _ = run(tmp_path, schedule=schedule, num_stages=stages, steps=4, weight_grads=weight_grads)
    assert summary["steps"] == 4
    reference = train_sync(cfg, 4)
    untrained = train_sync(cfg, 0)
    assert max_diff(trained, untrained) > 1e-4  # the run really trained
    assert max_diff(trained, reference) < 1e-5


# The middle stage is one ReLU: no parameters, so its optimizer steps an empty group.
RELU_ALONE = [["x", "net.0"], ["net.1"], ["net.2", "net.3", "net.4", "net.5", "net.6", "net.7", "net.8"]]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1", "pipedream"])
def test_a_stage_without_parameters_trains_in_every_schedule(tmp_path, schedule):
    cfg, summary, trained, _ = run(tmp_path, schedule=schedule, stages=RELU_ALONE, steps=3, optimizer="sgd", lr=0.5)
    assert summary["steps"] == 3
    expected = emulate_async(cfg, 3, stash=True) if schedule == "pipedream" else train_sync(cfg, 3)
    assert max_diff(trained, train_sync(cfg, 0)) > 1e-4
    assert max_diff(trained, expected) < 1e-5


def test_dp_with_ddp_equals_gradient_accumulation(tmp_path):
    cfg, _, trained, _ = run(tmp_path, schedule="dp", workers=2, steps=3)
    assert max_diff(trained, train_sync(cfg, 3)) < 1e-5


@pytest.mark.parametrize("stages,microbatches,vertical_sync,replicas,weight_grads", [
    (3, 4, False, None, "batched"), (3, 4, True, None, "batched"), (2, 4, False, None, "batched"),
    (2, 4, True, None, "batched"), (3, 4, False, None, "immediate"), (2, 4, True, None, "immediate"),
    (2, 1, False, None, "batched"), (3, 1, True, None, "immediate"),  # M=1: PipeDream's own, one update per minibatch
    (2, 4, False, [2, 1], "batched"), (2, 4, True, [2, 2], "batched"), (2, 4, False, [2, 1], "immediate"),
])
def test_pipedream_matches_weight_stashing_emulation(tmp_path, stages, microbatches, vertical_sync, replicas,
                                                     weight_grads):
    """One update per batch of M microbatches, each backward against its forward's version (the
    batched weight gradients of a batch whose microbatches ran on two versions included)."""
    cfg, summary, trained, _ = run(tmp_path, schedule="pipedream", num_stages=stages, steps=3,
                                   microbatches=microbatches, vertical_sync=vertical_sync, replicas=replicas,
                                   weight_grads=weight_grads, optimizer="sgd", lr=0.5)  # large enough that stale weights show
    assert summary["steps"] == 3
    stashed = emulate_async(cfg, 3, stash=True)
    unstashed = emulate_async(cfg, 3, stash=False)
    assert max_diff(stashed, train_sync(cfg, 0)) > 1e-4  # the emulation really trained
    assert max_diff(stashed, unstashed) > 1e-4  # stashing changes the result, so the test can tell
    assert max_diff(trained, stashed) < 1e-5


def test_pipedream_updates_once_per_batch(tmp_path):
    """Three batches of four microbatches: three updates, and (one stage has nothing in flight
    across an update) the same weights as gradient accumulation."""
    cfg, _, trained, _ = run(tmp_path, schedule="pipedream", num_stages=1, steps=3, optimizer="sgd", lr=0.05)
    assert max_diff(trained, train_sync(cfg, 3)) < 1e-5
    assert max_diff(trained, train_sync(cfg, 2)) > 1e-4


@pytest.mark.parametrize("schedule", ["1f1b", "pipedream"])
def test_replicas_hold_identical_weights(tmp_path, schedule):
    cfg, _, trained, states = run(tmp_path, schedule=schedule, num_stages=2, replicas=[2, 1], steps=2,
                                  checkpoint_every=1)
    from pipeboard.trainer.runtime.checkpoint import complete_steps, load_rank

    for step in complete_steps(tmp_path):
        a, b = load_rank(tmp_path, step, 0)["stages"][0]["module"], load_rank(tmp_path, step, 1)["stages"][0]["module"]
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"step {step}: replicas differ in {k}"
    if schedule == "1f1b":  # synchronous replication is still plain gradient accumulation
        assert max_diff(trained, train_sync(cfg, 2)) < 1e-5
