"""Running a schedule in spawned workers and comparing it with one process."""

from __future__ import annotations

from pipeboard.trainer.runtime import RunConfig, run_training
from pipeboard.trainer.runtime.checkpoint import assemble_model
from pipeboard.trainer.runtime.reference import train_sync
from tests.trainer.params import max_diff

# 10 layers: enough for 4 workers x 2 chunks
MLP = {"depth": 4, "width": 48, "samples": 512}


def runtime_vs_one_process(tmp_path, schedule: str, workers: int, microbatches: int = 8, steps: int = 3,
                           **options) -> tuple[float, float]:
    """Train ``steps`` steps under ``schedule`` on ``workers`` workers; returns (difference from
    single-process gradient accumulation, difference from the untrained model)."""
    cfg = RunConfig(model="mlp", model_args=MLP, batch_size=2 * microbatches, microbatches=microbatches,
                    checkpoint_dir=str(tmp_path), eval_at_end=False, schedule=schedule, num_stages=workers,
                    steps=steps, **options)
    assert run_training(cfg)["steps"] == steps
    trained, _ = assemble_model(cfg, tmp_path)
    return max_diff(trained, train_sync(cfg, steps)), max_diff(trained, train_sync(cfg, 0))
