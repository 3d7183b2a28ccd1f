"""Pilot runs: what a run's actions take beyond the profile's prediction, measured by the runtime
itself, and applied to every prediction the profile makes."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from pipeboard.trainer.profile.calibration_records import Link, Pilot, PilotKind
from pipeboard.trainer.profile.schema import Layer, Profile, ProfileError
from pipeboard.trainer.runtime.pilot import even_stages, factors
from pipeboard.trainer.schedule.actions import TimelineEvent
from pipeboard.trainer.schedule.predict import stage_costs
from pipeboard.trainer.schedule.refit import measured_terms


def chain(n: int = 4, link: Link | None = None) -> Profile:
    layers = [Layer(name=f"l{i}", forward_ms=1.0 + i, backward_ms=2.0, backward_input_ms=1.0, optimizer_ms=0.5,
                    activation_bytes=1000.0, parameter_bytes=4000.0) for i in range(n)]
    return Profile(layers=layers, edges=[(f"l{i}", f"l{i + 1}") for i in range(n - 1)], model="chain", batch_size=4,
                   link=link)


def batched_chain(n: int, weight_batch_size: int, link: Link | None = None) -> Profile:
    """chain(n) with each layer's batched weight gradients timed at ``weight_batch_size`` samples."""
    prof = chain(n, link=link)
    for layer in prof.layers:
        layer.weight_batched_ms = 0.8
    prof.weight_batch_size = weight_batch_size
    return prof


def test_even_stages_cut_by_profiled_time_into_contiguous_non_empty_stages():
    prof = chain(4)  # forward + backward: 3, 4, 5, 6 ms
    assert even_stages(prof, 2) == [["l0", "l1", "l2"], ["l3"]] or even_stages(prof, 2) == [["l0", "l1"], ["l2", "l3"]]
    assert even_stages(prof, 4) == [["l0"], ["l1"], ["l2"], ["l3"]]
    assert even_stages(prof, 9) == [["l0"], ["l1"], ["l2"], ["l3"]]  # at most one stage per layer
    assert even_stages(prof, 1) == [["l0", "l1", "l2", "l3"]]
    for count in (2, 3):
        stages = even_stages(prof, count)
        assert len(stages) == count and all(stages) and sum(stages, []) == prof.layer_names()


def events_at(costs, scale: dict[str, float], gap_s: float = 0.0, steps: int = 4, microbatches: int = 2,
              allreduce_s: float | None = None, replicas: int = 1) -> list[TimelineEvent]:
    """What a run records when each kind of action takes ``scale`` times its predicted cost, with
    ``gap_s`` between consecutive actions of a worker."""
    out = []
    for k, c in enumerate(costs):
        for r in range(replicas):
            worker, t = k * replicas + r, 0.0
            for step in range(steps):
                actions = [("F", c.fwd_s * scale["forward"])] * (microbatches // replicas)
                actions += [("BI", c.bwd_input_s * scale["backward_input"])] * (microbatches // replicas)
                actions += [("W", c.bwd_weight_batched_s * scale["weight_batched"] * (microbatches // replicas))]
                if allreduce_s is not None:
                    actions.append(("allreduce", allreduce_s))
                actions.append(("step", c.step_s * scale["step"]))
                for j, (kind, span) in enumerate(actions):
                    mb = -1 if kind in ("W", "step", "allreduce") else j % max(1, microbatches // replicas)
                    out.append(TimelineEvent(worker, k, r, mb, kind, t, t + span, step))
                    t += span + gap_s
    return out


def test_factors_recover_how_much_longer_each_kind_of_action_took():
    prof = batched_chain(4, weight_batch_size=8)
    stages = [["l0", "l1"], ["l2", "l3"]]
    costs = stage_costs(prof, stages, microbatches=2, pilot=False)
    scale = {"forward": 1.5, "backward_input": 1.2, "weight_batched": 2.0, "step": 3.0}
    got = factors(prof, stages, [1, 1], events_at(costs, scale, gap_s=0.0001), microbatches=2, steps=4)
    assert got.factors == pytest.approx(scale)
    assert got.gaps_ms == pytest.approx(0.1 * 9 / 7, rel=0.3)  # 9 gaps of a step over its 7 compute actions
    assert got.allreduce_wait_ms is None and (got.stages, got.replicas) == (2, 1)


def test_a_replicated_pilot_keeps_the_all_reduce_beyond_its_transfer():
    link = Link(latency_ms=0.05, bytes_per_ms=1e6)
    prof = batched_chain(2, weight_batch_size=16, link=link)
    whole = [["l0", "l1"]]
    costs = stage_costs(prof, whole, microbatches=4, replicas=[2], pilot=False)
    assert costs[0].allreduce_s > 0
    one = dict.fromkeys(("forward", "backward_input", "weight_batched", "step"), 1.0)
    got = factors(prof, whole, [2], events_at(costs, one, steps=4, microbatches=4, replicas=2,
                                              allreduce_s=costs[0].allreduce_s + 0.003), microbatches=4, steps=4)
    assert got.allreduce_wait_ms == pytest.approx(3.0)
    # a replica's W(-1) covers its own share of the microbatches (2 of 4), not all of them
    assert got.factors["weight_batched"] == pytest.approx(1.0)


def test_stage_costs_apply_the_pipeline_pilot_to_single_stages_and_the_replicated_one_to_replicas():
    link = Link(latency_ms=0.05, bytes_per_ms=1e6)
    prof = chain(4, link=link)
    stages = [["l0", "l1"], ["l2", "l3"]]
    plain = stage_costs(prof, stages, microbatches=2, replicas=[2, 1])
    prof.pilot = Pilot(pipeline=PilotKind(2, 1, {"forward": 2.0, "step": 1.5}, gaps_ms=0.1),
                       replicated=PilotKind(1, 2, {"forward": 3.0, "backward_input": 0.5}, gaps_ms=0.0,
                                            allreduce_wait_ms=4.0),
                       batch_size=8, microbatches=2, steps=16)
    piloted = stage_costs(prof, stages, microbatches=2, replicas=[2, 1])
    rep, one = piloted[0], piloted[1]
    assert rep.fwd_s == pytest.approx(plain[0].fwd_s * 3.0)
    assert rep.bwd_input_s == pytest.approx(plain[0].bwd_input_s * 0.5)
    assert rep.step_s == pytest.approx(plain[0].step_s)
    assert rep.allreduce_s == pytest.approx(plain[0].allreduce_s + 0.004)
    assert one.fwd_s == pytest.approx(plain[1].fwd_s * 2.0 + 0.0001)
    assert one.bwd_input_s == pytest.approx(plain[1].bwd_input_s + 0.0001)  # no factor: only the gap
    assert one.step_s == pytest.approx(plain[1].step_s * 1.5)
    assert one.allreduce_s == plain[1].allreduce_s == 0
    assert stage_costs(prof, stages, microbatches=2, replicas=[2, 1], pilot=False) == plain


def test_the_pilot_round_trips_and_bad_fields_are_refused():
    prof = chain(2)
    prof.pilot = Pilot(pipeline=PilotKind(2, 1, {"forward": 1.25}, gaps_ms=0.1), replicated=None, batch_size=8,
                       microbatches=2, steps=16, wall_s=3.5)
    back = Profile.from_dict(prof.to_dict())
    assert back.pilot == prof.pilot
    for change, match in [({"steps": 0}, "pilot.steps"), ({"extra": 1}, "unknown field"),
                          ({"pipeline": {**asdict(prof.pilot.pipeline), "factors": {"forward": -1}}}, "factors"),
                          ({"pipeline": {**asdict(prof.pilot.pipeline), "factors": {"bogus": 1}}}, "factors"),
                          ({"replicated": {"stages": 1, "replicas": 0, "factors": {}}}, "replicas")]:
        data = prof.to_dict()
        data["pilot"] = {**data["pilot"], **change}
        with pytest.raises(ProfileError, match=match):
            Profile.from_dict(data)


def test_a_replicas_batched_weight_pass_counts_its_own_microbatches():
    evs = [TimelineEvent(0, 0, 0, j, "F", j, j + 0.5, 3) for j in range(2)]
    evs.append(TimelineEvent(0, 0, 0, -1, "W", 2.0, 2.6, 3))
    assert measured_terms(evs, microbatches=4)[("weight_batched", 0)] == [pytest.approx(0.3)]


@pytest.mark.slow
def test_a_pilot_of_a_zoo_model_measures_both_kinds_of_run(tmp_path):
    """The runtime really runs: two stages, then one stage on two replicas."""
    from pipeboard.app.services.profile_run import profile

    data = profile("mlp-digits", {}, 8, calibrate=True, run_batch_size=16, weight_batch_size=16, threads=1,
                   machine_cache=str(tmp_path), machine_max_age_s=3600, pilot_workers=2, pilot_microbatches=2)
    pilot = Profile.from_dict(data).pilot
    assert pilot is not None and (pilot.batch_size, pilot.microbatches) == (16, 2)
    assert (pilot.pipeline.stages, pilot.pipeline.replicas) == (2, 1)
    assert (pilot.replicated.stages, pilot.replicated.replicas) == (1, 2)
    for kind in (pilot.pipeline, pilot.replicated):
        assert set(kind.factors) >= {"forward", "backward_input", "weight_batched", "step"}
        assert all(0.01 < f < 100 for f in kind.factors.values()), kind.factors
    assert pilot.replicated.allreduce_wait_ms is not None and pilot.pipeline.allreduce_wait_ms is None


def test_more_workers_than_cores_take_the_oversubscribed_pilots_factor():
    pilot = Pilot(pipeline=None, replicated=None, batch_size=8, microbatches=2, steps=16, oversubscribed_workers=4,
                  oversubscribed_factor=1.25)
    assert pilot.step_factor(4, 2) == 1.25 and pilot.step_factor(3, 2) == 1.25
    assert pilot.step_factor(2, 2) == 1.0 and pilot.step_factor(4, None) == 1.0
    assert Pilot(None, None, 8, 2, 16).step_factor(4, 2) == 1.0  # not measured
    prof = chain(2)
    prof.pilot = pilot
    assert Profile.from_dict(prof.to_dict()).pilot == pilot
    data = prof.to_dict()
    data["pilot"]["oversubscribed_factor"] = 0
    with pytest.raises(ProfileError, match="oversubscribed_factor"):
        Profile.from_dict(data)


def test_data_parallelism_on_more_workers_than_cores_takes_the_replicated_oversubscribed_factor():
    pilot = Pilot(pipeline=None, replicated=None, batch_size=8, microbatches=2, steps=16, oversubscribed_workers=3,
                  oversubscribed_factor=1.25, oversubscribed_replicated_factor=0.6)
    assert pilot.step_factor(4, 2, replicated=True) == 0.6 and pilot.step_factor(4, 2) == 1.25
    assert pilot.step_factor(2, 2, replicated=True) == 1.0  # not oversubscribed
    # a plan of several stages, one of them replicated, hands microbatches on: the pipeline's
    assert pilot.step_factor(4, 2, replicated=True, stages=2) == 1.25
    # where only one was measured, either plan takes it
    assert Pilot(None, None, 8, 2, 16, oversubscribed_factor=1.25).step_factor(4, 2, replicated=True) == 1.25
    only_dp = Pilot(None, None, 8, 2, 16, oversubscribed_replicated_factor=0.6)
    assert only_dp.step_factor(4, 2, replicated=True, stages=2) == 0.6 and only_dp.step_factor(4, 2) == 1.0
    prof = chain(2)
    prof.pilot = pilot
    assert Profile.from_dict(prof.to_dict()).pilot == pilot
    for bad in (0, -1.0, "x"):
        data = prof.to_dict()
        data["pilot"]["oversubscribed_replicated_factor"] = bad
        with pytest.raises(ProfileError, match="oversubscribed_replicated_factor"):
            Profile.from_dict(data)


def test_a_pilot_on_more_workers_than_cores_runs_the_whole_model_on_that_many_replicas(monkeypatch):
    from pipeboard.trainer.runtime import pilot as pilot_mod

    runs = []

    def record(cfg):
        runs.append((len(cfg.stages), list(cfg.replicas)))
        return None  # as a failed run: no figures, the pilot goes on

    monkeypatch.setattr(pilot_mod, "_run", record)
    pilot_mod.measure(chain(4), "chain", {}, batch_size=8, microbatches=2, workers=4, cores=2)
    assert runs == [(2, [1, 1]), (1, [2])]  # nothing measured: no oversubscribed pilots on top

    steps_s = iter([0.01, 0.01, 0.01, 0.05, 0.02, 0.01, 0.03, 0.02])  # each oversubscribed pilot runs 3 times

    def succeed(cfg):
        runs.append((len(cfg.stages), list(cfg.replicas)))
        costs = stage_costs(prof, cfg.stages, microbatches=2, replicas=cfg.replicas, pilot=False)
        ones = dict.fromkeys(("forward", "backward_input", "weight_batched", "step"), 1.0)
        return events_at(costs, ones), {"step_s": next(steps_s)}

    runs.clear()
    prof = batched_chain(4, weight_batch_size=8)
    monkeypatch.setattr(pilot_mod, "_run", succeed)
    got = pilot_mod.measure(prof, "chain", {}, batch_size=8, microbatches=2, workers=4, cores=2)
    assert runs == [(2, [1, 1]), (1, [2])] + [(4, [1, 1, 1, 1])] * 3 + [(1, [4])] * 3
    many, whole = [[f"l{i}"] for i in range(4)], [[f"l{i}" for i in range(4)]]
    # each factor is of its runs' median step: 0.02 of 0.01, 0.05, 0.02; 0.02 of 0.01, 0.03, 0.02
    assert got.oversubscribed_factor == pytest.approx(
        pilot_mod.oversubscribed_factor(prof, got.pipeline, many, 2, 2, 0.02))
    assert got.oversubscribed_replicated_factor == pytest.approx(
        pilot_mod.oversubscribed_factor(prof, got.replicated, whole, 2, 2, 0.02, [4]))

    def oversubscribed_fail(cfg):  # an oversubscribed pilot that fails is not run again
        if len(cfg.stages) * max(cfg.replicas) > 2:
            runs.append((len(cfg.stages), list(cfg.replicas)))
            return None
        return succeed(cfg)

    runs.clear()
    steps_s = iter([0.01] * 2)
    monkeypatch.setattr(pilot_mod, "_run", oversubscribed_fail)
    got = pilot_mod.measure(prof, "chain", {}, batch_size=8, microbatches=2, workers=4, cores=2)
    assert runs == [(2, [1, 1]), (1, [2]), (4, [1, 1, 1, 1]), (1, [4])]
    assert got.pipeline and got.oversubscribed_factor is None and got.oversubscribed_replicated_factor is None


def test_the_oversubscribed_factor_is_the_measured_step_over_the_piloted_prediction():
    from pipeboard.trainer.runtime.pilot import oversubscribed_factor
    from pipeboard.trainer.schedule.predict import profile_overhead, steady_step_s

    prof = batched_chain(4, weight_batch_size=8)
    stages = [[f"l{i}"] for i in range(4)]
    pipeline = PilotKind(2, 1, {"forward": 2.0}, gaps_ms=0.0)
    piloted = Profile.from_dict({**prof.to_dict(), "pilot": {"pipeline": asdict(pipeline), "replicated": None,
                                                               "batch_size": 8, "microbatches": 2, "steps": 16}})
    predicted = steady_step_s(stage_costs(piloted, stages, microbatches=2, overhead=profile_overhead(prof, stages)),
                              "1f1b", 2, batch_weight_grads=True, cores=2)
    assert oversubscribed_factor(prof, pipeline, stages, 2, 2, 1.5 * predicted) == pytest.approx(1.5)
    assert oversubscribed_factor(prof, pipeline, stages, 2, 2, None) is None


def test_even_stages_give_every_stage_parameters():
    prof = chain(6)
    for i in (1, 3, 4, 5):  # l0 W, l1 -, l2 W, l3 -, l4 -, l5 -: two stages at most
        prof.layers[i].parameter_bytes = 0.0
    assert even_stages(prof, 4) == [["l0"], ["l1", "l2", "l3", "l4", "l5"]]
    assert even_stages(prof, 1) == [[f"l{i}" for i in range(6)]]


def test_a_pilot_that_fails_leaves_its_figures_out(monkeypatch):
    from pipeboard.trainer.runtime import pilot as pilot_mod
    from pipeboard.trainer.runtime.launch import RunFailed

    def fail(cfg, sink):
        raise RunFailed("stage 1 (rank 1) failed: ValueError: optimizer got an empty parameter list")

    monkeypatch.setattr("pipeboard.trainer.runtime.launch.run_training", fail)
    got = pilot_mod.measure(chain(4), "chain", {}, batch_size=8, microbatches=2, workers=4, cores=2)
    assert got.pipeline is None and got.replicated is None and got.oversubscribed_factor is None


def test_a_pilots_step_beyond_its_actions_is_its_step_factor():
    from pipeboard.trainer.runtime.pilot import pilot_steps, predicted_step_s

    prof = batched_chain(4, weight_batch_size=8)
    stages = [["l0", "l1"], ["l2", "l3"]]
    costs = stage_costs(prof, stages, microbatches=2, pilot=False)
    one = dict.fromkeys(("forward", "backward_input", "weight_batched", "step"), 1.0)
    plain = predicted_step_s(prof, None, stages, [1, 1], 2)
    got = factors(prof, stages, [1, 1], events_at(costs, one), microbatches=2, steps=4, measured_step_s=1.3 * plain)
    assert got.step_factor == pytest.approx(1.3)
    pilot = Pilot(pipeline=got, replicated=PilotKind(1, 2, {}, step_factor=0.9), batch_size=8, microbatches=2, steps=16,
                  oversubscribed_workers=4, oversubscribed_factor=1.5)
    assert pilot.step_factor(2, 2) == pytest.approx(1.3)
    assert pilot.step_factor(2, 2, replicated=True) == pytest.approx(0.9)
    assert pilot.step_factor(4, 2, replicated=True) == pytest.approx(1.5)
    # about PILOT_SECONDS of predicted steps, an even count, never under 16
    n = pilot_steps(prof, stages, [1, 1], 2)
    assert n % 2 == 0 and n >= 16 and n == pytest.approx(0.5 / plain, abs=2) or n in (16, 200)


def test_a_whole_backward_is_its_parts_each_corrected_by_the_pilots_own_factor():
    """Pilots run batched weight gradients: they measure BI and W, never a whole B. Data parallelism's B
    (and an unsplit run's) is charged BI's part times BI's factor plus the rest times W's, not the whole
    B times BI's factor (gpt2-text's pilot: BI 1.59, W 0.53; the whole B at 1.59 was 40% over its spans)."""
    prof = chain(2)
    whole = [["l0", "l1"]]
    plain = stage_costs(prof, whole, microbatches=4, replicas=[2])[0]
    bi, rest = plain.bwd_input_s, plain.bwd_s - plain.bwd_input_s
    assert bi > 0 and rest > 0
    pilot = {"forward": 1.0, "backward_input": 1.6, "weight_batched": 0.5}
    prof.pilot = Pilot(pipeline=None, replicated=PilotKind(1, 2, pilot, gaps_ms=0.2), batch_size=8, microbatches=4,
                       steps=16)
    got = stage_costs(prof, whole, microbatches=4, replicas=[2])[0]
    assert got.bwd_s == pytest.approx(bi * 1.6 + rest * 0.5 + 0.0002)
    assert got.bwd_input_s == pytest.approx(bi * 1.6 + 0.0002)
    # a pilot that measured whole backwards applies its own factor to them
    prof.pilot = Pilot(pipeline=None, replicated=PilotKind(1, 2, {**pilot, "backward": 1.25}, gaps_ms=0.0),
                       batch_size=8, microbatches=4, steps=16)
    assert stage_costs(prof, whole, microbatches=4, replicas=[2])[0].bwd_s == pytest.approx(plain.bwd_s * 1.25)
