"""The combined forward-and-backward action (actions.OverlapFB, torch's OVERLAP_F_B): written as
its two actions with the pair noted in meta, timed in sequence by default (pipeboard's runtime runs
the two halves one after the other, on CPU as everywhere) or overlapped when asked, and run by the
runtime with gradients equal to one process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeboard.trainer.schedule import ScheduleError, build, costs_uniform, registry, simulate, validate
from pipeboard.trainer.schedule.actions import Action, Kind, OverlapFB

PLUGIN = Path(__file__).resolve().parents[1] / "schedule_overlap_plugin.py"


@pytest.fixture(scope="module")
def paired():
    """The plugin's schedule, registered for this module's tests only (other tests list the registry)."""
    registry.load_module(str(PLUGIN))
    yield "1f1b-paired"
    registry.unregister("1f1b-paired")
    sys.modules.pop("pipeboard_schedules.schedule_overlap_plugin", None)


def test_a_pair_is_a_forward_and_a_backward():
    with pytest.raises(ScheduleError, match="an overlapped pair is a forward and a backward"):
        OverlapFB(Action(Kind.BACKWARD, 0, 0), Action(Kind.FORWARD, 0, 1))
    with pytest.raises(ScheduleError, match="cannot hold a backward and its own forward, F2@s1v0"):
        OverlapFB(Action(Kind.FORWARD, 1, 2), Action(Kind.BACKWARD, 1, 2))
    assert str(OverlapFB(Action(Kind.FORWARD, 0, 3), Action(Kind.BACKWARD, 3, 1))) == "(F3@s0v0;B1@s3v0)"


def test_pairs_are_written_as_their_two_actions_and_noted_in_meta(paired):
    s = build(paired, 3, 6)
    assert validate(s).workers == 3  # raises if it could deadlock
    compute = [[a for a in acts if a.kind.is_compute] for acts in s.actions]
    pairs = s.meta["overlap_f_b"]
    # the steady state's forwards with the backward after each; the last stage: forward k + 1 with backward k
    assert [len(p) for p in pairs] == [4, 5, 5]
    assert pairs[2] == [[2, k + 1, 2, k] for k in range(5)]
    for w, mine in enumerate(pairs):
        for fs, fm, bs, bm in mine:
            k = compute[w].index(Action(Kind.FORWARD, fs, fm))
            assert compute[w][k + 1] == Action(Kind.BACKWARD, bs, bm)


def by_worker(result, w):
    return {(e.kind, e.microbatch): (e.start, e.end) for e in result.timeline if e.worker == w and e.kind in ("F", "B")}


def test_in_sequence_a_pair_is_its_two_actions_overlapped_it_lasts_the_longer_of_them(paired):
    costs = costs_uniform(3, fwd_s=1.0, bwd_s=2.0)
    s = build(paired, 3, 6)
    sequence = simulate(s, costs)
    assert sequence.extra["overlap_f_b"] is False
    last = by_worker(sequence, 2)
    for fs, fm, bs, bm in s.meta["overlap_f_b"][2]:
        assert last[("B", bm)][0] == pytest.approx(last[("F", fm)][1])  # one after the other
    overlapped = simulate(s, costs, overlap_f_b=True)
    assert overlapped.extra["overlap_f_b"] is True
    last = by_worker(overlapped, 2)
    for fs, fm, bs, bm in s.meta["overlap_f_b"][2]:
        assert last[("B", bm)][0] == pytest.approx(last[("F", fm)][0])  # together
    # the last stage is the critical path: each of its 5 pairs costs max(F, B) = 2 instead of 3
    assert sequence.iteration_time_s - overlapped.iteration_time_s == pytest.approx(5 * 1.0)


def test_a_pair_naming_a_stage_its_worker_does_not_hold_is_refused():
    def builder(ctx):
        return [[OverlapFB(Action(Kind.FORWARD, 0, 0), Action(Kind.BACKWARD, 1, 0))], []]

    registry.register("test-bad-pair", builder, description="a pair across workers.")
    try:
        with pytest.raises(ScheduleError, match=r"worker 0 pairs \(F0@s0v0;B0@s1v0\), but holds stages \[0\] only"):
            build("test-bad-pair", 2, 1)
    finally:
        registry.unregister("test-bad-pair")


def test_runtime_runs_pairs_with_gradients_equal_to_one_process(paired, tmp_path, monkeypatch):
    from pipeboard.trainer.runtime import RunConfig, run_training
    from pipeboard.trainer.runtime.checkpoint import assemble_model
    from pipeboard.trainer.runtime.reference import train_sync
    from tests.trainer.params import max_diff

    monkeypatch.setenv(registry.ENV, str(PLUGIN))  # the spawned workers load it too
    cfg = RunConfig(model="mlp", model_args={"depth": 4, "width": 48, "samples": 512}, batch_size=16,
                    microbatches=4, checkpoint_dir=str(tmp_path), eval_at_end=False, schedule=paired,
                    num_stages=2, steps=3)
    assert run_training(cfg)["steps"] == 3
    trained, _ = assemble_model(cfg, tmp_path)
    assert max_diff(trained, train_sync(cfg, 0)) > 1e-4
    assert max_diff(trained, train_sync(cfg, 3)) < 1e-5
