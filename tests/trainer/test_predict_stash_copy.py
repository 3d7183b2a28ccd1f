"""Weight stashing's copy: which steps make it (one rule, shared by the executor and the
simulator), what the calibration measures, and what the prediction charges for it."""

from __future__ import annotations

import math

import pytest

from pipeboard.trainer.profile.calibration_records import Overhead
from pipeboard.trainer.profile.schema import Layer, Profile, ProfileError
from pipeboard.trainer.runtime.overhead import measure_stash_copy
from pipeboard.trainer.schedule import build
from pipeboard.trainer.schedule.actions import Kind
from pipeboard.trainer.schedule.predict import predict_step_s, profile_overhead, stage_costs
from pipeboard.trainer.schedule.simulator import simulate
from pipeboard.trainer.schedule.action_costs import costs_uniform
from pipeboard.trainer.schedule.stash import steps_keeping_version

SAMPLE = {"layers": 1, "last": False, "forward_ms": 0.0, "backward_ms": 0.0, "backward_input_ms": 0.0,
          "weight_call_ms": 0.0, "step_ms": 0.0}


def kept(schedule) -> list[list[int]]:
    """Per worker, the stages of the steps that keep the version they replace."""
    return [[acts[i].stage for i in sorted(steps_keeping_version(acts))] for acts in schedule.actions]


def test_pipedream_keeps_the_old_version_where_forwards_of_it_still_wait_for_their_backward():
    sched = build("pipedream", 3, 12, per_update=3)
    got = kept(sched)
    # the last stage runs each forward's backward next: nothing outlives its step; the others
    # hold forwards of the old version in flight when they step
    assert got[2] == [] and got[0] and got[1]
    steps = [[a for a in acts if a.kind is Kind.STEP] for acts in sched.actions]
    assert len(got[0]) <= len(steps[0])


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "dp"])
def test_a_flush_leaves_no_step_a_version_to_keep(name):
    sched = build(name, 1 if name == "dp" else 3, 6, **({"replicas": [2]} if name == "dp" else {}))
    assert kept(sched) == [[] for _ in sched.actions]


def test_the_copy_is_charged_to_those_steps_only():
    base = costs_uniform(3, 1e-3, 2e-3, step_s=0.5e-3)
    copying = [c.__class__(**{**c.__dict__, "stash_copy_s": 4e-3}) for c in base]
    sched = build("pipedream", 3, 12, per_update=3)
    extra = simulate(sched, copying).iteration_time_s - simulate(sched, base).iteration_time_s
    assert extra > 0
    # the last stage's steps never copy: a copy charged to it alone changes nothing
    last_only = base[:2] + [copying[2]]
    assert simulate(sched, last_only).iteration_time_s == pytest.approx(simulate(sched, base).iteration_time_s)
    flush = build("1f1b", 3, 6)
    assert simulate(flush, copying).iteration_time_s == pytest.approx(simulate(flush, base).iteration_time_s)


def test_the_calibrated_copy_interpolates_and_bad_ones_are_refused():
    o = Overhead(samples=[SAMPLE], stash_copy=[[1000.0, 1.0], [3000.0, 2.0]])
    assert o.stash_copy_ms(0) == 0.0
    assert o.stash_copy_ms(500) == pytest.approx(0.5)  # from zero below the smallest
    assert o.stash_copy_ms(2000) == pytest.approx(1.5)
    assert o.stash_copy_ms(5000) == pytest.approx(3.0)  # the last slope beyond
    assert Overhead(samples=[SAMPLE]).stash_copy_ms(5000) == 0.0
    assert Overhead.from_dict({"samples": [SAMPLE], "stash_copy": [[1000, 1.0]]}).stash_copy == [[1000.0, 1.0]]
    for bad in ([], [[0, 1.0]], [[1000, -1.0]], [[1000]], "fast"):
        with pytest.raises(ProfileError, match="stash_copy"):
            Overhead.from_dict({"samples": [SAMPLE], "stash_copy": bad})


def _profile(optimizer: str) -> Profile:
    layers = [Layer(name=f"l{i}", forward_ms=1.0, backward_ms=2.0, backward_input_ms=1.0, optimizer_ms=0.25,
                    activation_bytes=1000.0, parameter_bytes=2000.0) for i in range(4)]
    return Profile(layers=layers, edges=[(f"l{i}", f"l{i + 1}") for i in range(3)], model="chain", batch_size=4,
                   meta={"optimizer": optimizer},
                   overhead=Overhead(samples=[SAMPLE], stash_copy=[[1000.0, 0.5], [8000.0, 4.0]]))


def test_the_prediction_charges_the_stages_weights_at_the_calibrated_rate_and_nothing_for_sgd():
    stages = [["l0", "l1"], ["l2", "l3"]]
    adam = _profile("adam")
    c = stage_costs(adam, stages, overhead=profile_overhead(adam, stages))
    assert [x.stash_copy_s for x in c] == [pytest.approx(2e-3)] * 2  # 4,000 bytes: 2 ms
    assert stage_costs(adam, stages)[0].stash_copy_s == 0.0  # uncalibrated: the profile's compute alone
    sgd = _profile("sgd")
    assert stage_costs(sgd, stages, overhead=profile_overhead(sgd, stages))[0].stash_copy_s == 0.0
    faster = predict_step_s(sgd, stages, "pipedream", 4, overhead=profile_overhead(sgd, stages))
    slower = predict_step_s(adam, stages, "pipedream", 4, overhead=profile_overhead(adam, stages))
    assert slower > faster
    assert (predict_step_s(adam, stages, "1f1b", 4, overhead=profile_overhead(adam, stages))
            == pytest.approx(predict_step_s(sgd, stages, "1f1b", 4, overhead=profile_overhead(sgd, stages))))


def test_the_copy_is_measured_on_the_runtimes_own_step_both_ways_alternating(monkeypatch):
    """What the calibration times is WeightVersions.step itself, keeping the replaced version and
    not, in turns (a slow spell of the machine falls on both); the figure is their difference,
    never negative. How large it is is a measurement, for bench/, not a test's to bound."""
    from pipeboard.trainer.runtime.versions import WeightVersions

    kept: list[bool] = []
    step = WeightVersions.step

    def spy(self, version, keep_current):
        kept.append(keep_current)
        return step(self, version, keep_current)

    monkeypatch.setattr(WeightVersions, "step", spy)
    (nbytes, ms), = measure_stash_copy(sizes=(1 << 20,), rounds=6)
    assert nbytes == 1 << 20 and math.isfinite(ms) and ms >= 0
    assert kept == [True, False] * 6
