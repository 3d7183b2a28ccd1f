"""bf16 mixed precision in every schedule: forwards under autocast (bf16 activations cross the
stage boundaries), float32 master weights and optimizer state; the loss stays within 2% of fp32's
after the same steps."""

from __future__ import annotations

import pytest
import torch

from pipeboard.trainer.runtime import RunConfig, run_training
from pipeboard.trainer.runtime.checkpoint import assemble_model, load_rank
from pipeboard.trainer.sink import ListSink

SMALL = {"depth": 4, "width": 64, "samples": 1024}
SCHEDULES = [("gpipe", {}), ("1f1b", {}), ("interleaved-1f1b", {"chunks": 2}), ("zb-h1", {}), ("pipedream", {}),
             ("dp", {"workers": 2}), ("1f1b", {"weight_grads": "immediate"})]


def _final_loss(tmp_path, precision, schedule, extra):
    sink = ListSink()
    stages = {} if schedule == "dp" else {"num_stages": 2}
    cfg = RunConfig(model="mlp", model_args=SMALL, schedule=schedule, batch_size=32, microbatches=4, steps=40, lr=3e-3,
                    eval_at_end=False, precision=precision, checkpoint_dir=str(tmp_path / precision),
                    **stages, **extra)
    summary = run_training(cfg, sink)
    losses = [r.values["loss"] for r in sorted(sink.metrics, key=lambda r: r.step) if "loss" in r.values]
    return cfg, summary, sum(losses[-5:]) / 5


@pytest.mark.parametrize("schedule,extra", SCHEDULES)
def test_bf16_loss_within_two_percent_of_fp32(tmp_path, schedule, extra):
    _, _, fp32 = _final_loss(tmp_path, "fp32", schedule, extra)
    cfg, summary, bf16 = _final_loss(tmp_path, "bf16", schedule, extra)
    assert summary["precision"] == "bf16"
    assert bf16 != fp32  # the forwards really ran in bf16
    assert abs(bf16 - fp32) / fp32 < 0.02, (fp32, bf16)
    # master weights and optimizer state stay float32
    state = load_rank(str(tmp_path / "bf16"), summary["steps"], 0)
    for stage in state["stages"].values():
        assert all(t.dtype == torch.float32 for t in stage["module"].values())
        moments = [v for s in stage["optimizer"]["state"].values() for k, v in s.items() if k != "step"]
        assert moments and all(t.dtype == torch.float32 for t in moments)
    trained, _ = assemble_model(cfg, str(tmp_path / "bf16"))
    assert all(p.dtype == torch.float32 for p in trained.parameters())


def test_bf16_activations_cross_the_boundary_as_bf16():
    from pipeboard.trainer.runtime import stage_modules
    from pipeboard.trainer.spec import load_task

    task = load_task("mlp", SMALL)
    example = task.example_input(4)
    modules = stage_modules.build_stages(task.model, example, stage_modules.uniform_split(
        *zip(*stage_modules.layer_sizes(task.model, example)), 2))
    assert {t.dtype for t in stage_modules.boundary_specs(modules, example, "bf16")[0].tensors} == {torch.bfloat16}
    assert {t.dtype for t in stage_modules.boundary_specs(modules, example, "fp32")[0].tensors} == {torch.float32}
