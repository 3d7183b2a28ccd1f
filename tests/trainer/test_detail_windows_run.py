"""Detail windows in real runs: a run whose stage fails keeps the steps before the failure in
full, and the attempt resumed from its checkpoint records its own first steps; every step of both
keeps its summary. Real worker processes, not generated reports (tests/trainer/test_detail_windows.py)."""

from __future__ import annotations

import pytest

from pipeboard.trainer.runtime import RunConfig, RunFailed, run_training
from pipeboard.trainer.sink import ListSink

SMALL = {"depth": 4, "width": 48, "samples": 2048}


def cfg(**kw) -> RunConfig:
    base = dict(model="mlp", model_args=SMALL, schedule="1f1b", batch_size=16, microbatches=4, num_stages=2,
                eval_at_end=False, steps=12, checkpoint_every=4)
    return RunConfig(**{**base, **kw})


def steps_with_actions(sink: ListSink) -> set[int]:
    return {e.step for e in sink.events}


def summarised(sink: ListSink) -> set[int]:
    return {r.step - 1 for r in sink.metrics if "stages" in r.values}


def test_a_failure_and_the_resume_each_get_their_window(tmp_path, monkeypatch) -> None:
    # no periodic windows, so every window seen is the opening one, the failure's or the resume's
    monkeypatch.setenv("PIPEBOARD_DETAIL_FIRST_STEPS", "2")
    monkeypatch.setenv("PIPEBOARD_DETAIL_EVERY", "0")
    monkeypatch.setenv("PIPEBOARD_DETAIL_BEFORE_FAILURE", "2")
    failed = ListSink()
    with pytest.raises(RunFailed):  # stage 1 raises in step 9 (a real allocation no device can make)
        run_training(cfg(checkpoint_dir=str(tmp_path), fail_at={"rank": 1, "step": 9, "mode": "oom"}), failed)
    before = steps_with_actions(failed)
    assert {0, 1} <= before, sorted(before)  # the opening window
    # the failure's: the failing step (rank 1 reported its actions at once) and, held in memory until the
    # error came, at least the 2 steps before it (and any step still incomplete when it came)
    window = sorted(before - {0, 1})
    assert window == list(range(window[0], 10)) and 2 <= 9 - window[0] <= 4, sorted(before)
    done = summarised(failed)  # every step completed before the failure has its summary
    assert done == set(range(max(done) + 1)) and max(done) >= window[0], sorted(done)

    resumed = ListSink()
    summary = run_training(cfg(checkpoint_dir=str(tmp_path), resume=True), resumed)
    assert summary["start_step"] == 8
    assert steps_with_actions(resumed) == {8, 9}  # the resumed attempt's own first steps
    assert summary["detail_steps"] == [[8, 9]]
    assert summarised(resumed) == set(range(8, 12))
