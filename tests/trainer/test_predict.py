"""predict_step_s and stage_costs on hand-made profiles; profile format v2 fields and links."""

from __future__ import annotations

import json

import pytest

from pipeboard.trainer.runtime.links import fit_link
from pipeboard.trainer.profile.calibration_records import Link
from pipeboard.trainer.profile.schema import Layer, Profile, ProfileError
from pipeboard.trainer.schedule.actions import ScheduleError
from pipeboard.trainer.schedule.predict import predict_step_s, repeat_iterations, stage_costs
from pipeboard.trainer.schedule import build
from pipeboard.trainer.profile.files import load_profile


def chain(times: list[tuple[float, float, float | None, float | None]], batch_size: int = 4,
          act_bytes: float = 1000.0, link: Link | None = None) -> Profile:
    """A chain of layers l0 -> l1 -> ... with (forward, backward, backward_input, optimizer) ms."""
    layers = [Layer(name=f"l{i}", forward_ms=f, backward_ms=b, backward_input_ms=bi, optimizer_ms=o,
                    activation_bytes=act_bytes, parameter_bytes=400.0)
              for i, (f, b, bi, o) in enumerate(times)]
    edges = [(f"l{i}", f"l{i + 1}") for i in range(len(times) - 1)]
    return Profile(layers=layers, edges=edges, model="chain", batch_size=batch_size, link=link)


TWO = [["l0", "l1"], ["l2", "l3"]]


def test_stage_costs_sum_the_layers_and_take_the_batched_weight_gradients_from_the_batch_profile():
    prof = chain([(0.5, 1.0, 0.25, 0.1), (0.5, 1.0, 0.5, 0.2), (1.0, 3.0, 1.0, 0.3), (0.25, 0.5, 0.5, 0.0)])
    big = chain([(2, 4, 1, 0.1), (2, 4, 2, 0.2), (4, 12, 4, 0.3), (1, 2, 2, 0.0)], batch_size=16)
    c0, c1 = stage_costs(prof, TWO, microbatches=4, batch_profile=big)
    assert (c0.fwd_s, c0.bwd_s, c0.bi_s, c0.w_s, c0.step_s) == pytest.approx((1e-3, 2e-3, 0.75e-3, 1.25e-3, 0.3e-3))
    assert (c1.fwd_s, c1.bwd_s, c1.bi_s, c1.w_s, c1.step_s) == pytest.approx((1.25e-3, 3.5e-3, 1.5e-3, 2e-3, 0.3e-3))
    # W(-1) over 4 microbatches: the batch profile's weight-gradient time (backward - input part) / 4
    assert c0.w_batched_s == pytest.approx((3 + 2) / 4 * 1e-3)
    assert c1.w_batched_s == pytest.approx((8 + 0) / 4 * 1e-3)
    assert c0.send_act_s == c1.send_grad_s == 0  # no link measured: transfers are free
    with pytest.raises(ScheduleError, match="batch_profile is for 16 samples"):
        stage_costs(prof, TWO, microbatches=2, batch_profile=big)
    with pytest.raises(ScheduleError, match="not in the profile"):
        stage_costs(prof, [["l0", "nope"], ["l2", "l3"]])


def test_old_profiles_without_the_split_fall_back_to_the_simulators_defaults():
    prof = chain([(1.0, 2.0, None, None)] * 4)
    c0, _ = stage_costs(prof, TWO)
    assert c0.bwd_input_s is None and c0.bi_s == pytest.approx(2e-3) and c0.step_s == 0


def test_one_stage_gpipe_is_m_forwards_and_backwards_and_a_step():
    prof = chain([(1.0, 2.0, 0.5, 0.25)])
    assert predict_step_s(prof, [["l0"]], "gpipe", 4) == pytest.approx(4 * (1 + 2) * 1e-3 + 0.25e-3)
    # batched: 4 x (F + BI), then one W(-1) of the whole batch's 3 ms, then the step
    big = chain([(4.0, 8.0, 5.0, 0.25)], batch_size=16)
    got = predict_step_s(prof, [["l0"]], "gpipe", 4, batch_profile=big, batch_weight_grads=True)
    assert got == pytest.approx((4 * (1 + 0.5) + 3 + 0.25) * 1e-3)


def test_two_stage_1f1b_steady_step_by_hand():
    # stages: F = 1, B = 2 (ms) each, step 0.5 on each. One iteration of 2 microbatches:
    # w0 F0 [0,1] F1 [1,2]; w1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; w0 B0 [4,6] B1 [7,9], step
    # [9,9.5]; the next iteration's F0 starts at 9.5 on w0: one step every 9.5 ms.
    prof = chain([(0.5, 1.0, 0.5, 0.25)] * 4)
    assert predict_step_s(prof, TWO, "1f1b", 2) == pytest.approx(9.5e-3)


def test_link_transfers_and_send_posting_by_hand():
    # gpipe, 2 stages, 1 microbatch, F = 1, B = 2 per stage, step 0.5; the link: 0.1 ms latency,
    # 1000 bytes in 0.2 ms, posting a send 0.05 ms (charged to the compute before the send).
    # w0: F + post [0, 1.05], transfer 0.3, w1: F [1.35, 2.35], B + post [2.35, 4.4], transfer 0.3,
    # w0: B [4.7, 6.7], step [6.7, 7.2]; w0 starts the next step at 7.2.
    link = Link(latency_ms=0.1, bytes_per_ms=5000.0, post_ms=0.05)
    prof = chain([(0.5, 1.0, 0.5, 0.25)] * 4, link=link)
    c0, c1 = stage_costs(prof, TWO)
    assert c0.send_act_s == pytest.approx(0.3e-3) and c1.send_grad_s == pytest.approx(0.3e-3)
    assert predict_step_s(prof, TWO, "gpipe", 1) == pytest.approx(7.2e-3)
    # the argument overrides the profile's link: without transfer costs, 2 x (1 + 2) + 0.5
    free = Link(latency_ms=0.0, bytes_per_ms=1e30, post_ms=0.0)
    assert predict_step_s(prof, TWO, "gpipe", 1, link=free) == pytest.approx(6.5e-3)


def test_pipedream_steady_state_is_one_update_per_batch():
    # two equal stages, F = 1, B = 2, step 0.5, no transfer costs: once the pipeline is full each
    # worker alternates F and B and steps once per batch of M, so a batch of 4 takes 4 x 3 + 0.5.
    prof = chain([(0.5, 1.0, 0.5, 0.25)] * 4)
    assert predict_step_s(prof, TWO, "pipedream", 4) == pytest.approx(12.5e-3)
    assert predict_step_s(prof, TWO, "pipedream", 1) == pytest.approx(3.5e-3)


def test_repeat_iterations_numbers_microbatches_and_versions_on():
    one = build("1f1b", 2, 3)
    three = repeat_iterations(one, 3)
    assert three.microbatches == 9
    for acts, base in zip(three.actions, one.actions):
        assert len(acts) == 3 * len(base)
        assert [a.microbatch for a in acts if a.kind.value == "F"] == list(range(9))
        assert [a.version for a in acts if a.kind.value == "step"] == [1, 2, 3]


def test_link_fit_keeps_latency_non_negative_with_the_best_line_through_the_origin():
    """Noisy small sizes can tip the free fit's intercept below zero; the fit is then the
    least-squares line with latency 0 (slope sum(xy) / sum(x^2)), not the free slope cut at 0."""
    samples = [[1000.0, 0.02, 0.01], [2000.0, 0.01, 0.01], [10000.0, 0.5, 0.01]]
    link = fit_link(samples)
    assert link.latency_ms == 0.0
    slope = sum(x * y for x, y, _ in samples) / sum(x * x for x, _, _ in samples)
    assert link.bytes_per_ms == pytest.approx(1 / slope)
    free = fit_link([[1000.0, 0.2, 0.0], [3000.0, 0.4, 0.0]])  # a positive intercept stays as fitted
    assert free.latency_ms == pytest.approx(0.1) and free.bytes_per_ms == pytest.approx(10000.0)


def test_profile_v2_round_trips_its_new_fields(tmp_path):
    link = fit_link([[1000.0, 0.3, 0.05], [3000.0, 0.7, 0.07]])
    assert link.latency_ms == pytest.approx(0.1) and link.bytes_per_ms == pytest.approx(5000.0)
    assert link.post_ms == pytest.approx(0.05) and link.transfer_ms(2000.0) == pytest.approx(0.5)
    prof = chain([(0.5, 1.0, 0.25, 0.1), (0.5, 1.0, None, None)], link=link)
    path = tmp_path / "p.json"
    prof.save(path)
    again = load_profile(path)
    assert again.to_dict() == prof.to_dict() and again.link == link
    assert again.layers[0].backward_input_ms == 0.25 and again.layers[0].backward_weight_ms == 0.75
    assert again.layers[1].backward_weight_ms is None and again.to_dict()["version"] == 2


def test_version_1_profiles_still_load():
    v1 = {"format": "pipeboard.profile", "version": 1, "model": "m", "batch_size": 8, "device": "cpu", "meta": {},
          "layers": [{"name": "x", "desc": "Input"}, {"name": "fc", "forward_ms": 1.0, "backward_ms": 2.0,
                                                       "forward_spread_ms": 0.0, "backward_spread_ms": 0.0,
                                                       "activation_bytes": 64.0, "stage_id": None}],
          "edges": [["x", "fc"]]}
    prof = Profile.from_json(json.dumps(v1))
    assert prof.layers[1].backward_input_ms is None and prof.layers[1].optimizer_ms is None and prof.link is None
    v1["layers"][1]["optimizer_ms"] = 1.0  # a version 1 file cannot carry version 2 fields
    with pytest.raises(ProfileError, match="unknown field"):
        Profile.from_json(json.dumps(v1))


@pytest.mark.parametrize("change,match", [
    ({"layers": [{"name": "fc", "backward_input_ms": -1.0}]}, "backward_input_ms"),
    ({"layers": [{"name": "fc", "optimizer_ms": "fast"}]}, "optimizer_ms"),
    ({"link": {"latency_ms": 0.1}}, "bytes_per_ms"),
    ({"link": {"latency_ms": 0.1, "bytes_per_ms": 5.0, "colour": 1}}, "unknown"),
    ({"link": [1, 2]}, "object"),
    ({"version": 3}, "version"),
])
def test_bad_v2_fields_are_refused(change, match):
    doc = {"format": "pipeboard.profile", "version": 2, "layers": [{"name": "fc"}], "edges": []} | change
    with pytest.raises(ProfileError, match=match):
        Profile.from_dict(doc)


@pytest.mark.parametrize("transport", ["gloo", "shm", None])
def test_measure_link_times_real_transfers_between_two_processes(transport, monkeypatch):
    from pipeboard.trainer.runtime.links import measure_link

    monkeypatch.delenv("PIPEBOARD_P2P", raising=False)
    link = measure_link(sizes=(4096, 1 << 20), repeats=3, busy_ms=1.0, transport=transport)
    assert link.backend == (transport or "shm")  # a local run's default transport: shared memory
    assert [s[0] for s in link.samples] == [4096.0, float(1 << 20)]
    assert all(s[1] > 0 and s[2] >= 0 for s in link.samples)
    assert link.bytes_per_ms > 0 and link.transfer_ms(1 << 20) > 0
    # the busy two-process all-reduce, a line of its own
    assert link.allreduce_latency_ms is not None and link.allreduce_bytes_per_ms > 0
    assert link.allreduce_ms(1 << 20, 2) > link.allreduce_latency_ms
    with pytest.raises(ValueError, match="two different sizes"):
        measure_link(sizes=(4096, 4096))
    with pytest.raises(ValueError, match="transport"):
        measure_link(transport="tcp")


def test_runtime_overhead_is_added_per_action():
    from pipeboard.trainer.schedule.predict import ActionOverhead

    prof = chain([(1.0, 2.0, 1.0, 0.25)], batch_size=4)
    big = chain([(2.0, 4.0, 2.0, 0.25)], batch_size=8)
    o = [ActionOverhead(forward_s=0.1e-3, backward_s=0.2e-3, backward_input_s=0.05e-3, weight_call_s=0.4e-3,
                        step_s=0.3e-3)]
    # immediate: 2 x (F 1.1 + B 2.2) + step 0.55
    assert predict_step_s(prof, [["l0"]], "gpipe", 2, overhead=o) == pytest.approx(7.15e-3)
    # batched: 2 x (F 1.1 + BI 1.05) + W(-1) (2 + 0.4) + step 0.55
    got = predict_step_s(prof, [["l0"]], "gpipe", 2, batch_profile=big, batch_weight_grads=True, overhead=o)
    assert got == pytest.approx(7.25e-3)
    with pytest.raises(ScheduleError, match="overhead"):
        stage_costs(prof, [["l0"]], overhead=o * 2)


# --- calibration carried by the profile --------------------------------------------------------

OVERHEAD_SAMPLES = [
    {"layers": 1, "last": False, "forward_ms": 0.1, "backward_ms": 0.2, "backward_input_ms": 0.1,
     "weight_call_ms": 0.3, "step_ms": 0.02},
    {"layers": 3, "last": False, "forward_ms": 0.3, "backward_ms": 0.4, "backward_input_ms": 0.2,
     "weight_call_ms": 0.7, "step_ms": 0.06},
    {"layers": 1, "last": True, "forward_ms": 0.5, "backward_ms": 0.3, "backward_input_ms": 0.2,
     "weight_call_ms": 0.3, "step_ms": 0.02},
]


def calibrated(weight_batch_size: int | None = 16) -> Profile:
    from pipeboard.trainer.profile.calibration_records import Overhead

    prof = chain([(0.5, 1.0, 0.25, 0.1), (0.5, 1.0, 0.5, 0.2), (1.0, 3.0, 1.0, 0.3), (0.25, 0.5, 0.5, 0.0)])
    for layer, w in zip(prof.layers, (2.0, 1.0, 6.0, 0.5)):
        layer.weight_batched_ms = w
    prof.weight_batch_size = weight_batch_size
    prof.overhead = Overhead(samples=[dict(s) for s in OVERHEAD_SAMPLES], microbatches=4)
    return prof


def test_overhead_interpolates_by_layer_count_and_kind_of_stage():
    prof = calibrated()
    # two layers: halfway between the one- and three-layer samples; five: on the same line
    assert prof.overhead.at(2, False) == pytest.approx(
        {"forward_ms": 0.2, "backward_ms": 0.3, "backward_input_ms": 0.15, "weight_call_ms": 0.5, "step_ms": 0.04})
    assert prof.overhead.at(5, False)["forward_ms"] == pytest.approx(0.5)
    # only one last-stage sample: it holds for every layer count
    assert prof.overhead.at(4, True)["forward_ms"] == pytest.approx(0.5)
    from pipeboard.trainer.profile.calibration_records import Overhead

    only_last = Overhead(samples=[OVERHEAD_SAMPLES[2]])
    assert only_last.at(2, False)["backward_ms"] == pytest.approx(0.3)  # the other kind's, never measured


def test_profile_overhead_and_the_profiles_own_batched_weight_gradients_by_hand():
    from pipeboard.trainer.schedule.predict import profile_overhead

    prof = calibrated()
    o = profile_overhead(prof, TWO)
    assert o[0].forward_s == pytest.approx(0.2e-3) and o[1].forward_s == pytest.approx(0.5e-3)  # 2 layers; last
    c0, c1 = stage_costs(prof, TWO, microbatches=4, overhead=o)
    assert c0.fwd_s == pytest.approx((0.5 + 0.5 + 0.2) * 1e-3)
    assert c0.w_batched_s == pytest.approx((2.0 + 1.0 + 0.5) / 4 * 1e-3)  # weight_batched_ms at 16 = 4 x 4, + call
    assert c1.w_batched_s == pytest.approx((6.0 + 0.5 + 0.3) / 4 * 1e-3)
    assert c0.step_s == pytest.approx((0.1 + 0.2 + 0.04) * 1e-3)
    # timed at another batch: not this W(-1)'s cost, so the per-microbatch weight gradients stand in
    other = stage_costs(calibrated(weight_batch_size=32), TWO, microbatches=4)
    assert other[0].bwd_weight_batched_s is None and other[0].w_batched_s == pytest.approx(other[0].w_s)
    assert profile_overhead(chain([(1, 1, 0.5, 0.1)] * 4), TWO) is None


def test_calibration_round_trips_and_older_v2_files_still_load():
    prof = calibrated()
    back = Profile.from_json(prof.to_json())
    assert back.overhead == prof.overhead and back.weight_batch_size == 16
    assert [layer.weight_batched_ms for layer in back.layers] == [2.0, 1.0, 6.0, 0.5]
    older = json.loads(prof.to_json())
    del older["overhead"], older["weight_batch_size"]
    for layer in older["layers"]:
        del layer["weight_batched_ms"]
    old = Profile.from_dict(older)
    assert old.overhead is None and old.weight_batch_size is None and old.layers[0].weight_batched_ms is None


@pytest.mark.parametrize("change, match", [
    (lambda d: d.update(overhead={"samples": []}), "non-empty 'samples'"),
    (lambda d: d["overhead"]["samples"][0].update(layers=0), "overhead.samples\\[0\\]: field 'layers'"),
    (lambda d: d["overhead"]["samples"][1].update(step_ms=-1), "overhead.samples\\[1\\]: field 'step_ms'"),
    (lambda d: d["overhead"]["samples"][0].pop("last"), "field 'last'"),
    (lambda d: d.update(weight_batch_size=0), "weight_batch_size"),
    (lambda d: d["layers"][2].update(weight_batched_ms="slow"), "weight_batched_ms"),
])
def test_bad_calibration_fields_are_refused(change, match):
    data = json.loads(calibrated().to_json())
    change(data)
    with pytest.raises(ProfileError, match=match):
        Profile.from_dict(data)


def test_measured_action_overhead_covers_every_action_and_calibrates_a_profile():
    from pipeboard.trainer.runtime.overhead import calibrate, measure_action_overhead

    o = measure_action_overhead(2, True, microbatches=2, rounds=3)
    assert all(v >= 0 for v in (o.forward_s, o.backward_s, o.backward_input_s, o.weight_call_s, o.step_s))
    cal = calibrate(layer_counts=(1, 2), microbatches=2, rounds=3)
    assert sorted((s["layers"], s["last"]) for s in cal.samples) == [(1, False), (1, True), (2, False), (2, True)]
    prof = chain([(1, 1, 0.5, 0.1)] * 4)
    prof.overhead = cal
    assert Profile.from_json(prof.to_json()).overhead == cal
    with pytest.raises(ValueError, match="layers"):
        measure_action_overhead(0, False)
