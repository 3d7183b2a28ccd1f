"""What the prediction charges outside the profiled compute: the executor's walk per action, the
per-step set-up, report and data loading, the measured all-reduce; and the runtime's batched
step reports."""

from __future__ import annotations

import json

import pytest

from pipeboard.trainer.profile.calibration_records import Link, Overhead
from pipeboard.trainer.profile.schema import Layer, Profile, ProfileError
from pipeboard.trainer.schedule.predict import ActionOverhead, predict_step_s, profile_overhead, stage_costs

SAMPLE = {"layers": 1, "last": False, "forward_ms": 0.0, "backward_ms": 0.0, "backward_input_ms": 0.0,
          "weight_call_ms": 0.0, "step_ms": 0.0}


def chain(n: int, batch_size: int = 4, link: Link | None = None) -> Profile:
    """n layers, each F 1 ms, B 2 ms (BI 1), optimizer 0.25 ms, 1,000-byte activations, 400 bytes of parameters."""
    layers = [Layer(name=f"l{i}", forward_ms=1.0, backward_ms=2.0, backward_input_ms=1.0, optimizer_ms=0.25,
                    activation_bytes=1000.0, parameter_bytes=400.0) for i in range(n)]
    return Profile(layers=layers, edges=[(f"l{i}", f"l{i + 1}") for i in range(n - 1)], model="chain",
                   batch_size=batch_size, link=link)


def test_the_executor_walk_and_the_per_step_cost_by_hand():
    prof, big = chain(1), chain(1, batch_size=8)
    for layer in big.layers:
        layer.backward_ms, layer.backward_input_ms = 4.0, 2.0  # W at the batch: 2 ms
    o = [ActionOverhead(executor_s=0.01e-3, per_step_s=0.5e-3)]
    # immediate: 2 x (F 1.01 + B 2.01) + step (0.25 + 0.01 + 0.5)
    assert predict_step_s(prof, [["l0"]], "gpipe", 2, overhead=o) == pytest.approx(6.8e-3)
    # batched: 2 x (F 1.01 + BI 1.01) + one W(-1) call 2.01 + step 0.76
    got = predict_step_s(prof, [["l0"]], "gpipe", 2, batch_profile=big, batch_weight_grads=True, overhead=o)
    assert got == pytest.approx(6.81e-3)
    # zero overhead predicts what no overhead does: the terms are additions, nothing else
    none = [ActionOverhead()]
    assert predict_step_s(prof, [["l0"]], "gpipe", 2, overhead=none) == pytest.approx(predict_step_s(prof, [["l0"]], "gpipe", 2))


def test_sends_are_walked_too_and_the_all_reduce_once():
    link = Link(latency_ms=0.0, bytes_per_ms=1e9, allreduce_latency_ms=0.3, allreduce_bytes_per_ms=400.0)
    prof = chain(2, link=link)
    o = [ActionOverhead(executor_s=0.1e-3)] * 2
    c0, c1 = stage_costs(prof, [["l0"], ["l1"]], overhead=o, replicas=[2, 1])
    assert c0.fwd_s == pytest.approx(1.2e-3) and c1.fwd_s == pytest.approx(1.1e-3)  # F, and its SEND_ACT
    assert c0.bwd_s == pytest.approx(2.1e-3) and c1.bwd_s == pytest.approx(2.2e-3)  # B, and its SEND_GRAD
    assert c0.step_s == pytest.approx(0.35e-3)
    # two replicas: the measured two-process all-reduce, 0.3 + 400 / 400 ms, and its walk
    assert c0.allreduce_s == pytest.approx(1.4e-3) and c1.allreduce_s == 0.0


def test_all_reduce_from_the_measured_line_or_else_the_point_to_point_one():
    measured = Link(latency_ms=0.05, bytes_per_ms=1000.0, allreduce_latency_ms=0.4, allreduce_bytes_per_ms=500.0)
    assert measured.allreduce_ms(1000.0, 1) == 0.0
    assert measured.allreduce_ms(1000.0, 2) == pytest.approx(0.4 + 1000 / 500)
    # four: 3 latencies, 2 x 3 / 4 of the bytes
    assert measured.allreduce_ms(1000.0, 4) == pytest.approx(3 * 0.4 + 1.5 * 1000 / 500)
    plain = Link(latency_ms=0.05, bytes_per_ms=1000.0)
    assert plain.allreduce_ms(1000.0, 2) == pytest.approx(2 * (500 / 1000 + 0.05))


def calibrated(stages: int) -> Profile:
    prof = chain(stages)
    prof.overhead = Overhead(samples=[dict(SAMPLE)], executor_action_ms=0.02, executor_step_ms=0.3,
                             load_first_ms=0.7, load_last_ms=0.4)
    return prof


def test_the_first_stage_loads_inputs_the_last_targets_a_middle_one_nothing():
    three = profile_overhead(calibrated(3), [["l0"], ["l1"], ["l2"]])
    assert [o.per_step_s * 1e3 for o in three] == pytest.approx([0.3 + 0.7, 0.3, 0.3 + 0.4])
    assert [o.executor_s for o in three] == pytest.approx([0.02e-3] * 3)
    one = profile_overhead(calibrated(1), [["l0"]])  # one stage: its first stage's load has the targets too
    assert one[0].per_step_s * 1e3 == pytest.approx(1.0)
    unmeasured = calibrated(1)
    unmeasured.overhead.load_first_ms = None
    assert profile_overhead(unmeasured, [["l0"]])[0].per_step_s * 1e3 == pytest.approx(0.3)


def test_w_pays_per_microbatch_for_each_layer_that_is_not_a_plain_linear():
    prof = calibrated(2)
    prof.overhead.generic_weight_ms = 0.1
    prof.layers[0].desc, prof.layers[1].desc = "Conv2d(1, 4, kernel_size=(3, 3))", "Linear(in_features=4)"
    o = profile_overhead(prof, [["l0"], ["l1"]])
    assert o[0].weight_per_microbatch_s == pytest.approx(0.1e-3) and o[1].weight_per_microbatch_s == 0.0
    for layer in prof.layers:
        layer.weight_batched_ms = 4.0  # at the profile's weight batch: 4 microbatches of 4
    prof.weight_batch_size = 16
    c0, c1 = stage_costs(prof, [["l0"], ["l1"]], microbatches=4, overhead=o)
    # per microbatch: the batched part 1 ms, the walk 0.02 ms shared by the call's 4, and the conv's 0.1 ms
    assert c0.w_batched_s == pytest.approx((1.0 + 0.02 / 4 + 0.1) * 1e-3)
    assert c1.w_batched_s == pytest.approx((1.0 + 0.02 / 4) * 1e-3)
    assert c0.w_s - c1.w_s == pytest.approx(0.1e-3)  # a split W per microbatch pays it too


def test_the_new_fields_round_trip_and_bad_ones_are_refused():
    prof = calibrated(2)
    prof.link = Link(latency_ms=0.01, bytes_per_ms=1e6, allreduce_latency_ms=0.2, allreduce_bytes_per_ms=1e5)
    back = Profile.from_json(prof.to_json())
    assert back.overhead == prof.overhead and back.link == prof.link
    older = json.loads(prof.to_json())  # a calibration made before these fields: zero, unmeasured
    for key in ("executor_action_ms", "executor_step_ms", "generic_weight_ms", "load_first_ms", "load_last_ms"):
        del older["overhead"][key]
    del older["link"]["allreduce_latency_ms"], older["link"]["allreduce_bytes_per_ms"]
    old = Profile.from_dict(older)
    assert old.overhead.executor_step_ms == 0.0 and old.overhead.load_first_ms is None
    assert old.link.allreduce_latency_ms is None
    for where, key, value in (("overhead", "executor_step_ms", -1), ("overhead", "load_first_ms", "slow"),
                              ("link", "allreduce_latency_ms", float("nan"))):
        data = json.loads(prof.to_json())
        data[where][key] = value
        with pytest.raises(ProfileError, match=key):
            Profile.from_dict(data)


def test_the_executor_overhead_measured_for_real():
    from pipeboard.trainer.runtime.overhead import measure_data_load, measure_executor_overhead
    from pipeboard.trainer.zoo import get

    per_action, per_step = measure_executor_overhead(rounds=8)
    # the walk and the per-step report cost something, and far less than a second
    assert 0 <= per_action < 0.01 and 0 < per_step < 0.1
    with pytest.raises(ValueError, match="two different"):
        measure_executor_overhead(microbatches=(4, 4))
    import torch

    from pipeboard.trainer.runtime.overhead import measure_generic_weight_overhead

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as calibrate() and the workers
    try:
        assert 0 < measure_generic_weight_overhead(layers=2, microbatches=2, rounds=20) < 0.01
    finally:
        torch.set_num_threads(threads)
    first, last = measure_data_load(get("mlp", depth=1, width=8, samples=64), 16, 4, steps=3)
    assert 0 < first < 1 and 0 < last < 1


def test_step_reports_go_in_batches_and_read_as_single_ones():
    """Batched step reports (worker.py puts them every quarter second) make the same records and
    summary as one message per step."""
    from pipeboard.trainer.runtime.instrument import Recorder, StepReports
    from pipeboard.trainer.runtime.report import Reporter
    from pipeboard.trainer.sink import NullSink

    class Channel(list):
        def put(self, message):
            self.append(message)

    channel, recorder = Channel(), Recorder(0.0)
    reports = StepReports(channel, 0, every_s=3600)
    for k in range(3):
        reports.step_done(k, recorder)
    assert channel == []  # held back
    reports.step_done(3, recorder, now=True)  # a step that must reach the launcher at once
    reports.step_done(4, recorder)
    reports.flush()
    assert [m[0] for m in channel] == ["steps", "steps"] and [len(m[2]) for m in channel] == [4, 1]
    batched, single = Reporter(NullSink(), 1, 4, "m"), Reporter(NullSink(), 1, 4, "m")
    for m in channel:
        batched.handle(m)
        for report in m[2]:
            single.handle(("step", 0, *report))
    assert batched.step_time == single.step_time and len(batched.step_time) == 5


def test_more_workers_than_cores_share_them():
    """Four one-stage replicas on two cores: each step's work, 4 x (F + B) + steps, spread over
    two cores, not the one-core-each simulation; with enough cores the simulation stands."""
    from pipeboard.trainer.schedule.action_costs import StageCosts
    from pipeboard.trainer.schedule.predict import steady_step_s

    costs = [StageCosts(fwd_s=1e-3, bwd_s=2e-3, step_s=0.5e-3)]
    alone = steady_step_s(costs, "gpipe", 4, replicas=[4])
    assert alone == pytest.approx(3.5e-3)  # one microbatch per replica, then its step
    assert steady_step_s(costs, "gpipe", 4, replicas=[4], cores=4) == pytest.approx(alone)
    assert steady_step_s(costs, "gpipe", 4, replicas=[4], cores=2) == pytest.approx(4 * 3.5e-3 / 2)
