"""A dead or hung stage ends the run quickly with an error naming it; checkpoints resume exactly."""

from __future__ import annotations

import os
import time

import pytest

from pipeboard.trainer.runtime import RunConfig, RunFailed, run_training
from pipeboard.trainer.runtime.checkpoint import complete_steps
from pipeboard.trainer.sink import ListSink

SMALL = {"depth": 4, "width": 48, "samples": 2048}


def cfg(**kw) -> RunConfig:
    base = dict(model="mlp", model_args=SMALL, schedule="1f1b", batch_size=16, microbatches=4, num_stages=2,
                eval_at_end=False)
    return RunConfig(**{**base, **kw})


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


class KillOnFirstMetrics(ListSink):
    """Kills worker ``rank`` (SIGKILL) once training is under way."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.pids: dict[int, int] = {}
        self.killed_at: float | None = None

    def on_status(self, phase, message="", **fields):
        super().on_status(phase, message, **fields)
        if phase == "running":
            self.pids = fields["pids"]

    def on_metrics(self, records):
        super().on_metrics(records)
        if self.killed_at is None and self.pids:
            os.kill(self.pids[self.rank], 9)
            self.killed_at = time.monotonic()


def test_killed_stage_fails_the_run_naming_it_and_nothing_is_left():
    sink = KillOnFirstMetrics(rank=1)
    with pytest.raises(RunFailed) as err:
        run_training(cfg(steps=100_000, p2p="shm"), sink)  # the survivor waits on shared memory
    assert time.monotonic() - sink.killed_at < 30
    assert "stage 1 (rank 1" in str(err.value) and "SIGKILL" in str(err.value)
    assert err.value.rank == 1 and err.value.stages == [1]
    assert sink.statuses[-1][0] == "failed"
    time.sleep(0.2)
    assert not any(alive(pid) for pid in sink.pids.values())
    # The workers talked through shared memory (same host); none of it outlives them.
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"pipeboard-{os.getpid()}-")]


def test_hung_stage_is_detected_and_named():
    sink = ListSink()
    start = time.monotonic()
    with pytest.raises(RunFailed) as err:
        run_training(cfg(steps=50, hang_timeout_s=2.0, fail_at={"rank": 0, "step": 3, "mode": "hang"}), sink)
    assert time.monotonic() - start < 30
    assert "stage 0 (rank 0" in str(err.value) and "hung" in str(err.value)
    pids = sink.statuses[1][2]["pids"]
    time.sleep(0.2)
    assert not any(alive(pid) for pid in pids.values())


@pytest.mark.parametrize(("schedule", "mode"), [("1f1b", "exit"), ("pipedream", "exit"), ("gpipe", "kill")])
def test_resume_continues_the_same_loss_trajectory(tmp_path, schedule, mode):
    full = ListSink()
    run_training(cfg(schedule=schedule, steps=8, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=4), full)
    losses = {r.step: r.values["loss"] for r in full.metrics if "loss" in r.values}
    assert len(losses) == 8

    crashed = tmp_path / "b"
    with pytest.raises(RunFailed, match="exited with code 3" if mode == "exit" else "killed by SIGKILL") as err:
        run_training(cfg(schedule=schedule, steps=8, checkpoint_dir=str(crashed), checkpoint_every=4,
                         fail_at={"rank": 1, "step": 5, "mode": mode}))
    assert err.value.lost == (mode == "kill")  # killed: the service would retry it; an exit code of its own: not
    assert complete_steps(crashed) == [4]
    resumed = ListSink()
    summary = run_training(cfg(schedule=schedule, steps=8, checkpoint_dir=str(crashed), checkpoint_every=4,
                               resume=True), resumed)
    assert summary["start_step"] == 4 and summary["steps"] == 8
    after = {r.step: r.values["loss"] for r in resumed.metrics if "loss" in r.values}
    assert sorted(after) == [5, 6, 7, 8]
    for step, loss in after.items():
        assert loss == pytest.approx(losses[step], rel=1e-6, abs=1e-7)
