"""The planner's candidates ranked by the job's predicted step time (planning.ranked_candidates)."""

from __future__ import annotations

import pytest

from pipeboard.app.services import planning
from pipeboard.trainer.profile.calibration_records import Link, Overhead
from pipeboard.trainer.profile.schema import Layer, Profile

SAMPLE = {"layers": 1, "last": False, "forward_ms": 0.0, "backward_ms": 0.0, "backward_input_ms": 0.0,
          "weight_call_ms": 0.0, "step_ms": 0.0}


def calibrated_chain(linears: int = 3) -> dict:
    """Linear, ReLU, Linear, ReLU, ... (``linears`` of each): each Linear F 1 ms, B 2 ms (BI 1),
    optimizer 0.1 ms; a ReLU 0.01 ms each way and no parameters; a measured link and runtime
    overhead."""
    layers = []
    for i in range(2 * linears):
        linear = i % 2 == 0
        layers.append(Layer(name=f"l{i}", desc="Linear(in_features=8)" if linear else "ReLU()",
                            forward_ms=1.0 if linear else 0.01, backward_ms=2.0 if linear else 0.01,
                            backward_input_ms=1.0 if linear else 0.01, optimizer_ms=0.1 if linear else 0.0,
                            weight_batched_ms=1.0 if linear else 0.0, activation_bytes=256.0,
                            parameter_bytes=4096.0 if linear else 0.0))
    prof = Profile(layers=layers, edges=[(f"l{i}", f"l{i + 1}") for i in range(2 * linears - 1)], model="chain",
                   batch_size=4,
                   link=Link(latency_ms=0.05, bytes_per_ms=1e6, allreduce_latency_ms=0.2, allreduce_bytes_per_ms=1e5),
                   overhead=Overhead(samples=[dict(SAMPLE)], executor_action_ms=0.01, executor_step_ms=0.1))
    prof.weight_batch_size = 16
    return prof.to_dict()


def test_candidates_are_ranked_by_the_prediction_and_each_can_train():
    data = calibrated_chain()
    levels = planning.levels_of(None, 2)
    planned = planning.make_plan(data, levels, memory_bytes=None, method="pipedream")
    ranked = planning.ranked_candidates(data, levels, planned, "1f1b", 4)
    assert len(ranked) >= 2
    times = [t for t, _ in ranked]
    assert times == sorted(times)
    for t, cand in ranked:  # each one's time is what simulate predicts for it
        assert planning.simulate(cand, "1f1b", 4, profile_data=data)[1].steady_step_s == t
        weighted = {layer["name"] for layer in data["layers"] if layer["parameter_bytes"] > 0}
        assert all(weighted.intersection(st["layers"]) for st in cand.to_dict()["stages"])
    chosen = planning.make_plan(data, levels, memory_bytes=None, method="pipedream", schedule="1f1b", microbatches=4)
    assert chosen.to_dict() == ranked[0][1].to_dict()
    # without the calibration the planner's own plan stands
    plain = {**data, "overhead": None, "link": None}
    assert planning.ranked_candidates(plain, levels, planned, "1f1b", 4) == []
    assert planning.make_plan(plain, levels, memory_bytes=None, method="pipedream", schedule="1f1b",
                              microbatches=4).to_dict() == planned.to_dict()


def test_splits_that_leave_a_stage_without_parameters_are_not_candidates():
    data = calibrated_chain()
    levels = planning.levels_of(None, 4)  # even splits of 6 layers over 4 put a ReLU alone on a stage
    planned = planning.make_plan(data, levels, memory_bytes=None, method="pipedream")
    weighted = {layer["name"] for layer in data["layers"] if layer["parameter_bytes"] > 0}
    for _, cand in planning.ranked_candidates(data, levels, planned, "1f1b", 4):
        assert all(weighted.intersection(st["layers"]) for st in cand.to_dict()["stages"])
    from pipeboard.trainer.plan import plan
    from pipeboard.trainer.profile.schema import Profile

    uniform = plan(Profile.from_dict(data), levels=levels, method="uniform").to_dict()
    assert any(not weighted.intersection(st["layers"]) for st in uniform["stages"])  # what was left out


def test_an_interleaved_plan_has_a_stage_per_chunk_of_every_worker():
    """interleaved-1f1b with 2 chunks on 2 workers: 4 plan stages (the run's virtual stages), none
    replicated, predicted from the profile; too few layers for them is a 422 naming chunks."""
    from pipeboard.app.services import planning
    from pipeboard.app.services.errors import ServiceError
    from pipeboard.trainer.profile.calibration_records import Link
    from pipeboard.trainer.profile.schema import Layer, Profile

    layers = [Layer(name=f"l{i}", forward_ms=1.0, backward_ms=2.0, backward_input_ms=1.0, optimizer_ms=0.1,
                    activation_bytes=1000.0, parameter_bytes=4000.0, weight_batched_ms=1.5) for i in range(6)]
    prof = Profile(layers=layers, edges=[(f"l{i}", f"l{i + 1}") for i in range(5)], model="chain", batch_size=4,
                   link=Link(latency_ms=0.05, bytes_per_ms=1e6), weight_batch_size=16).to_dict()
    for method in ("pipedream", "uniform"):
        made = planning.make_plan(prof, planning.levels_of(None, 2), memory_bytes=None, method=method,
                                  schedule="interleaved-1f1b", microbatches=4, chunks=2)
        stages = made.to_dict()["stages"]
        assert len(stages) == 4 and all((st.get("replicas") or 1) == 1 for st in stages), stages
        _, sim = planning.simulate(made, "interleaved-1f1b", 4, chunks=2, profile_data=prof)
        assert sim.cost_model == "profile" and sim.steady_step_s > 0
    with pytest.raises(ServiceError, match="chunks"):
        planning.make_plan(prof, planning.levels_of(None, 4), memory_bytes=None, method="pipedream",
                           schedule="interleaved-1f1b", microbatches=4, chunks=2)


def test_more_workers_than_cores_scale_data_parallelism_and_pipelines_by_their_own_pilot():
    from pipeboard.trainer.plan import plan
    from pipeboard.trainer.plan.plan_format import Plan

    data = calibrated_chain()
    data["meta"] = {**(data.get("meta") or {}), "cores": 2}
    piloted = {**data, "pilot": {"pipeline": None, "replicated": None, "batch_size": 16, "microbatches": 4,
                                 "steps": 16, "oversubscribed_workers": 3, "oversubscribed_factor": 2.0,
                                 "oversubscribed_replicated_factor": 0.5}}
    prof, levels = Profile.from_dict(data), planning.levels_of(None, 4)
    dp = plan(prof, levels=levels, method="dp")  # one stage on 4 replicas
    straight = plan(prof, levels=levels, method="time")  # 4 stages of one replica
    mixed = dp.to_dict()  # l0-l1 on one worker, l2-l5 on three replicas
    whole = mixed["stages"][0]
    mixed["stages"] = [{**whole, "index": 0, "layers": whole["layers"][:2], "replicas": 1, "workers": [0]},
                       {**whole, "index": 1, "layers": whole["layers"][2:], "replicas": 3, "workers": [1, 2, 3]}]
    for cand, factor in ((dp, 0.5), (straight, 2.0), (Plan.from_dict(mixed), 2.0)):
        assert planning.stage_replicas(cand) in ([4], [1, 1, 1, 1], [1, 3])
        plain = planning.simulate(cand, "1f1b", 4, profile_data=data)[1].steady_step_s
        assert planning.simulate(cand, "1f1b", 4, profile_data=piloted)[1].steady_step_s == pytest.approx(factor * plain)
