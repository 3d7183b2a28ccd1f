"""A profile measured at the lengths a task's data has: it records the lengths measured
and the per-batch length histogram it assumed, the plan made from it says so, a step's prediction
at a length comes from the costs measured at that length, and profiles without lengths still load."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from pipeboard.trainer.plan import plan
from pipeboard.trainer.profile.lengths import LengthCosts, choose_lengths, histogram, interpolate
from pipeboard.trainer.profile.calibration_records import Link
from pipeboard.trainer.profile.schema import Layer, Profile, ProfileError
from pipeboard.trainer.schedule.actions import ScheduleError
from pipeboard.trainer.schedule.predict import predict_step_s


def test_lengths_are_chosen_from_the_data_and_counted_in_bands():
    data = [16, 20, 20, 30, 100, 200, 500, 512]
    chosen = choose_lengths(data, 4)
    assert chosen[0] == 16 and chosen[-1] == 512 and set(chosen) <= set(data) and len(chosen) == 4
    edges, counts = histogram(data, 4)
    assert edges[0] == 16 and edges[-1] == 512 and len(edges) == 5
    assert counts == [5, 1, 0, 2] and sum(counts) == len(data)
    assert choose_lengths([64] * 5, 4) == [64] and histogram([64] * 5) == ([64.0, 64.0], [5])
    # piecewise linear between measured points, the nearest segment beyond them, never below 0
    assert interpolate([10, 20, 40], [1.0, 3.0, 11.0], 30) == pytest.approx(7.0)
    assert interpolate([10, 20, 40], [1.0, 3.0, 11.0], 50) == pytest.approx(15.0)
    assert interpolate([10, 20], [1.0, 3.0], 0) == 0.0


def _quadratic_profile() -> Profile:
    """Two layers whose forward time grows with the square of the length, measured at 16, 128, 264
    and 512, over data that is mostly short."""
    measured = [16, 128, 264, 512]
    fwd = [1e-4 * n * n + 0.5 for n in measured]
    per_layer = {name: {"forward_ms": fwd, "backward_ms": [2 * f for f in fwd],
                        "activation_bytes": [4.0 * 64 * n for n in measured]} for name in ("a", "b")}
    costs = LengthCosts(dim=1, measured=measured, layers=per_layer, edges=[16.0, 264.0, 512.0], counts=[9, 1],
                        batch_size=8)
    expected = costs.expected()
    layers = [Layer(name="x", desc="Input", activation_bytes=8.0)]
    layers += [Layer(name=n, desc="Block", parameter_bytes=4096.0, **expected[n]) for n in ("a", "b")]
    return Profile(layers=layers, edges=[("x", "a"), ("a", "b")], model="toy", batch_size=2, lengths=costs)


def test_the_expected_cost_weights_each_band_not_the_mean_length():
    prof = _quadratic_profile()
    a = {layer.name: layer for layer in prof.layers}["a"]
    short, long = prof.at_length(140.0), prof.at_length(388.0)  # the two bands' middles
    ms = {layer.name: layer for layer in short.layers}["a"].forward_ms
    ml = {layer.name: layer for layer in long.layers}["a"].forward_ms
    assert a.forward_ms == pytest.approx(0.9 * ms + 0.1 * ml)
    # at the mean length the cost would be another figure: time is not linear in length
    assert a.forward_ms != pytest.approx(prof.at_length(prof.lengths.mean_length()).layers[1].forward_ms)


def test_a_long_batch_is_predicted_from_the_costs_at_its_length():
    prof = _quadratic_profile()
    stages = [["x", "a"], ["b"]]
    short = predict_step_s(prof, stages, "1f1b", 4, length=16)
    long = predict_step_s(prof, stages, "1f1b", 4, length=512)
    assert long > short
    # exactly the prediction from a profile whose layers hold the costs measured at 512
    at = prof.lengths.layers
    fixed = Profile(layers=[prof.layers[0]] + [Layer(name=n, desc="Block", parameter_bytes=4096.0,
                                                     forward_ms=at[n]["forward_ms"][-1],
                                                     backward_ms=at[n]["backward_ms"][-1],
                                                     activation_bytes=at[n]["activation_bytes"][-1])
                                               for n in ("a", "b")],
                    edges=prof.edges, model="toy", batch_size=2)
    assert long == pytest.approx(predict_step_s(fixed, stages, "1f1b", 4))
    with pytest.raises(ScheduleError, match="one length"):
        predict_step_s(fixed, stages, "1f1b", 4, length=64)


def test_the_profile_and_the_plan_say_which_lengths_they_assumed():
    prof = _quadratic_profile()
    back = Profile.from_json(prof.to_json())
    assert back.lengths == prof.lengths and back.layers == prof.layers
    made = plan(back, [(2, 1e9)])
    assumed = made.options["lengths"]
    assert assumed["measured"] == [16, 128, 264, 512] and assumed["histogram"]["counts"] == [9, 1]
    assert "lengths" not in plan(Profile(layers=prof.layers, edges=prof.edges, batch_size=2), [(2, 1e9)]).options


def test_profiles_without_lengths_still_load_and_bad_lengths_are_named():
    data = _quadratic_profile().to_dict()
    old = {k: v for k, v in data.items() if k != "lengths"}
    assert Profile.from_dict(old).lengths is None
    v2_only = ("backward_input_ms", "optimizer_ms", "weight_batched_ms", "saved_bytes", "weight_grad_bytes",
               "weight_input_bytes")
    v1 = {**{k: v for k, v in old.items() if k not in ("link", "overhead", "pilot", "weight_batch_size")},
          "version": 1, "layers": [{k: v for k, v in layer.items() if k not in v2_only} for layer in old["layers"]]}
    assert Profile.from_dict(v1).lengths is None
    bad = json.loads(json.dumps(data))
    bad["lengths"]["layers"]["a"]["forward_ms"] = [1.0]
    with pytest.raises(ProfileError, match=r"^profile JSON: lengths.layers\['a'\].forward_ms must be 4 numbers"):
        Profile.from_dict(bad)
    bad = json.loads(json.dumps(data))
    bad["lengths"]["measured"] = [512, 16, 128, 264]
    with pytest.raises(ProfileError, match="lengths.measured must be a non-empty ascending list"):
        Profile.from_dict(bad)


def test_a_causal_lm_is_profiled_at_its_datas_lengths():
    pytest.importorskip("transformers")
    from pipeboard.trainer.profile.at_lengths import padded_lengths, profile_at_lengths
    from pipeboard.trainer.zoo.varlen_text import causal_lm

    task = causal_lm(lo=4, hi=48, samples=96, layers=1, dim=16)
    batches = [x for x, _ in itertools.islice(task.train_batches(8), 12)]
    lengths = padded_lengths(batches, 1)
    prof = profile_at_lengths(task.model, batches, 1, 4, points=3, bands=4, warmup=1, repeats=2,
                              split_backward=False, optimizer_steps=False)
    got = prof.lengths
    assert got.measured == choose_lengths(lengths, 3) and got.measured[0] == min(lengths)
    assert got.measured[-1] == max(lengths) and sum(got.counts) == len(batches) and got.batch_size == 8
    # the costs at a measured length are the ones measured there; bytes grow with the length
    short, long = prof.at_length(got.measured[0]), prof.at_length(got.measured[-1])
    for i, layer in enumerate(prof.layers):
        assert short.layers[i].forward_ms == got.layers[layer.name]["forward_ms"][0]
        assert long.layers[i].activation_total == pytest.approx(
            sum(got.layers[layer.name]["activation_bytes"][-1])
            if isinstance(got.layers[layer.name]["activation_bytes"][-1], list)
            else got.layers[layer.name]["activation_bytes"][-1])
    assert long.layers[-1].activation_total > short.layers[-1].activation_total > 0
    assert Profile.from_json(prof.to_json()).lengths == got


def _costed(prof: Profile) -> Profile:
    """The profile with what the profile cost model needs (input-gradient part, optimizer step, a link)."""
    layers = [replace(layer, backward_input_ms=layer.backward_ms / 2, optimizer_ms=0.01) if layer.parameter_bytes
              else layer for layer in prof.layers]
    return replace(prof, layers=layers, link=Link(latency_ms=0.01, bytes_per_ms=1e6), meta={"optimizer": "sgd"})


def test_memory_is_predicted_at_the_longest_length_and_time_at_the_expected_costs():
    from pipeboard.trainer.choose import simulate_plan
    from pipeboard.trainer.schedule.predict import stage_costs
    from pipeboard.trainer.tune import cost, search

    prof = _costed(_quadratic_profile())
    longest = prof.at_longest()
    assert [layer.activation_bytes for layer in longest.layers[1:]] == [4.0 * 64 * 512] * 2
    assert prof.layers[1].activation_bytes < longest.layers[1].activation_bytes  # mostly short data
    stages = [["x", "a"], ["b"]]
    costs = stage_costs(prof, stages)
    assert [c.activation_bytes for c in costs] == [int(8.0 + 4.0 * 64 * 512), int(4.0 * 64 * 512)]
    # time stays the expected cost: the same forward as costed at one length on the expected layers
    one_length = replace(prof, lengths=None)  # the expected costs, as a profile of one length
    assert [c.fwd_s for c in costs] == [c.fwd_s for c in stage_costs(one_length, stages)]
    # the service's and CLI's prediction (simulate_plan) and the tuner's agree on the longest's memory
    split = plan(prof, levels=[(2, 1e9)], method="uniform")
    _, sim = simulate_plan(split, "1f1b", 4, profile_data=prof.to_dict(), compare_data_parallel=False)
    _, sim_expected = simulate_plan(split, "1f1b", 4, profile_data=one_length.to_dict(), compare_data_parallel=False)
    assert max(sim.peak_memory_bytes) > max(sim_expected.peak_memory_bytes)
    result = search([prof], workers=2, batch_size=8, microbatches=(4,), schedules=["1f1b"])
    chosen = next(c for c in result.candidates if not any(c.recompute))
    filled = cost.in_flight(prof.at_longest(), chosen.plan)
    assert [st["activation_bytes"] for st in filled["stages"]] > [st["activation_bytes"] for st in chosen.plan["stages"]]
    assert chosen.stage_memory_bytes == cost.predict_memory(filled, "1f1b", 4, 1, [False, False], "sgd")

