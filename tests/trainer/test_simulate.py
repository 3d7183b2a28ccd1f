"""The simulator reproduces the analytic bubbles and the papers' claims, and its numbers agree with the timeline."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeboard.trainer.schedule import Kind, ScheduleError, build
from pipeboard.trainer.schedule.action_costs import StageCosts, costs_from_plan, costs_uniform, plan_replicas
from pipeboard.trainer.schedule.simulator import simulate
from pipeboard.trainer.schedule.stats import summarize
from pipeboard.trainer.schedule.validator import validate

FWD, BWD = 1.0, 2.0


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (4, 3), (8, 32), (5, 7)])
def test_uniform_stages_give_the_analytic_bubble(name, p, m):
    result = simulate(build(name, p, m), costs_uniform(p, FWD, BWD))
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert result.iteration_time_s == pytest.approx((m + p - 1) * (FWD + BWD))
    assert result.throughput == pytest.approx(m / result.iteration_time_s)


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (2, 3, 4), (4, 4, 8), (3, 2, 9)])
def test_interleaving_divides_the_bubble_by_the_chunks(p, v, m):
    result = simulate(build("interleaved-1f1b", p, m, chunks=v), costs_uniform(p, FWD, BWD))
    assert result.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1))


def test_pipedream_steady_state_has_no_bubble():
    p = 4
    result = simulate(build("pipedream", p, 40), costs_uniform(p, FWD, BWD))
    assert result.steady_bubble_fraction == pytest.approx(0.0, abs=1e-12)
    assert result.stashed_versions == [p - s for s in range(p)]
    # after the warm-up every stage finishes one minibatch per F + B
    ends = sorted(e.end for e in result.timeline if e.kind == "B" and e.stage == 0)
    assert ends[30] - ends[10] == pytest.approx(20 * (FWD + BWD))
    assert result.steady_throughput == pytest.approx(1 / (FWD + BWD))
    assert result.throughput < result.steady_throughput  # the whole run includes fill and drain


def test_1f1b_has_a_bubble_in_its_steady_state_only_when_stages_differ():
    costs = costs_uniform(3, FWD, BWD)
    assert simulate(build("1f1b", 3, 12), costs).steady_bubble_fraction == pytest.approx(0.0, abs=1e-12)
    slow_middle = [costs[0], replace(costs[1], fwd_s=2.0, bwd_s=4.0), costs[2]]
    assert simulate(build("1f1b", 3, 12), slow_middle).steady_bubble_fraction > 0.2


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (6, 12)])
def test_zb_h1_beats_1f1b_when_w_is_split_off(p, m):
    costs = costs_uniform(p, FWD, BWD)  # BI = W = B / 2
    zb = simulate(build("zb-h1", p, m), costs)
    one = simulate(build("1f1b", p, m), costs)
    assert zb.iteration_time_s < one.iteration_time_s
    # the paper's bubble: (p-1)(F + BI - W) per worker instead of 1F1B's (p-1)(F + B)
    assert zb.iteration_time_s == pytest.approx(m * (FWD + BWD) + (p - 1) * FWD)
    assert max(zb.peak_activations) == max(one.peak_activations)


def test_data_parallel_time_is_local_work_plus_all_reduce():
    result = simulate(build("dp", 3, 7), costs_uniform(1, FWD, BWD, allreduce_s=0.5))
    assert result.iteration_time_s == pytest.approx(3 * (FWD + BWD) + 0.5)  # 7 over 3 workers: 3, 2, 2
    assert result.utilization[0] > result.utilization[1]


def test_pre_posted_receives_overlap_transfers_with_compute():
    """Moving every RECV to just before its consumer (no pre-posting) makes transfers cost time."""
    p, m = 4, 8
    costs = costs_uniform(p, FWD, BWD, comm_s=0.5)
    early = build("1f1b", p, m)
    late = build("1f1b", p, m)
    for acts in late.actions:
        recvs = [a for a in acts if a.kind in (Kind.RECV_ACT, Kind.RECV_GRAD)]
        rest = [a for a in acts if a.kind not in (Kind.RECV_ACT, Kind.RECV_GRAD)]
        acts[:] = []
        for a in rest:
            if a.kind.is_compute:
                wanted = Kind.RECV_ACT if a.kind is Kind.FORWARD else Kind.RECV_GRAD
                acts += [r for r in recvs if r.kind is wanted and r.microbatch == a.microbatch]
            acts.append(a)
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(late)  # and a runtime with blocking sends would hang on it
    assert simulate(early, costs).iteration_time_s < simulate(late, costs).iteration_time_s


def test_transfers_appear_in_the_timeline_and_delay_consumers():
    result = simulate(build("gpipe", 2, 1), costs_uniform(2, FWD, BWD, comm_s=0.25))
    kinds = sorted(e.kind for e in result.timeline)
    assert kinds == ["B", "B", "F", "F", "send_act", "send_grad", "step", "step"]
    assert result.iteration_time_s == pytest.approx(2 * (FWD + BWD) + 0.5)


def test_memory_counts_activations_and_stashed_versions():
    costs = costs_uniform(4, FWD, BWD, activation_bytes=100, weight_bytes=1000)
    # versions x weights + in flight x activations, plus one gradient buffer and adam's two
    # moments (3 x 1000 more per worker: memory_model's formula)
    assert simulate(build("pipedream", 4, 12), costs).peak_memory_bytes == [7400, 6300, 5200, 4100]
    assert simulate(build("gpipe", 4, 12), costs).peak_memory_bytes == [5200] * 4
    assert simulate(build("gpipe", 4, 12), costs, optimizer="sgd-plain").peak_memory_bytes == [3200] * 4
    assert simulate(build("gpipe", 4, 12), costs_uniform(4, FWD, BWD)).peak_memory_bytes is None


def test_result_agrees_with_the_stats_of_its_own_timeline():
    result = simulate(build("1f1b", 4, 9, replicas=[1, 2, 1, 1]), costs_uniform(4, FWD, BWD, comm_s=0.1, allreduce_s=0.3))
    stats = summarize(result.timeline)
    assert stats.makespan_s == pytest.approx(result.iteration_time_s)
    assert stats.bubble_fraction == pytest.approx(result.bubble_fraction)
    assert stats.utilization == pytest.approx(result.utilization)
    assert stats.steady_bubble_fraction == pytest.approx(result.steady_bubble_fraction)
    summary = result.summary()
    assert {"iteration_time_s", "bubble_fraction", "utilization", "peak_activations", "throughput"} <= set(summary)


def test_a_schedule_missing_a_send_stalls():
    schedule = build("gpipe", 2, 2)
    schedule.actions[0] = [a for a in schedule.actions[0] if not (a.kind is Kind.SEND_ACT and a.microbatch == 1)]
    with pytest.raises(ScheduleError, match="stalled"):
        simulate(schedule, costs_uniform(2, FWD, BWD))


def test_costs_must_match_the_stages():
    with pytest.raises(ScheduleError, match="costs"):
        simulate(build("1f1b", 4, 4), costs_uniform(3, FWD, BWD))
    with pytest.raises(ScheduleError, match="fwd_s"):
        StageCosts(fwd_s=-1.0, bwd_s=1.0)


def test_costs_from_a_plan():
    plan = {
        "stages": [
            {"forward_s": 0.010, "backward_s": 0.020, "send_s": 0.004, "allreduce_s": 0.0, "replicas": 1,
             "activation_bytes": 64.0, "parameter_bytes": 1000.0},
            {"forward_s": 0.020, "backward_s": 0.040, "send_s": 0.0, "allreduce_s": 0.003, "replicas": 2,
             "activation_bytes": 32.0, "parameter_bytes": 500.0},
        ]
    }  # fmt: skip
    costs = costs_from_plan(plan)
    assert plan_replicas(plan) == [1, 2]
    assert costs[0].send_act_s == pytest.approx(0.002) and costs[1].send_grad_s == pytest.approx(0.002)

    def period(replicas: list[int]) -> float:
        result = simulate(build("pipedream", 2, 40, replicas=replicas), costs)
        ends = sorted(e.end for e in result.timeline if e.kind == "B" and e.stage == 0)
        return (ends[30] - ends[10]) / 20

    # unreplicated, the 60 ms stage sets the pace; two replicas bring it near the input stage's 30 ms
    # (not to it: the replicas all-reduce each round, which couples them)
    assert period([1, 1]) == pytest.approx(0.060)
    assert 0.030 <= period(plan_replicas(plan)) < 0.040
    with pytest.raises(ScheduleError, match="stages"):
        costs_from_plan({"stages": []})


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(["gpipe", "1f1b", "zb-h1", "pipedream"]),
    replicas=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    rounds=st.integers(1, 4),
    fwd=st.floats(0.1, 3.0),
    comm=st.floats(0.0, 1.0),
)
def test_any_replicated_pipeline_builds_validates_and_simulates(name, replicas, rounds, fwd, comm):
    m = rounds * 6  # a multiple of every replica count up to 3, as pipedream needs
    schedule = build(name, len(replicas), m, replicas=replicas)
    validate(schedule)
    result = simulate(schedule, costs_uniform(len(replicas), fwd, 2 * fwd, comm_s=comm, allreduce_s=comm))
    assert 0.0 <= result.bubble_fraction < 1.0
    assert all(0.0 < u <= 1.0 + 1e-9 for u in result.utilization)
    work = {Kind.FORWARD: fwd, Kind.BACKWARD: 2 * fwd, Kind.BACKWARD_INPUT: fwd, Kind.BACKWARD_WEIGHT: fwd}
    busiest = max(sum(work.get(a.kind, 0.0) for a in acts) for acts in schedule.actions)
    assert result.iteration_time_s >= busiest * (1 - 1e-9)


@settings(max_examples=15, deadline=None)
@given(p=st.integers(1, 5), chunks=st.integers(2, 3), groups=st.integers(1, 3), comm=st.floats(0.0, 1.0))
def test_any_interleaved_pipeline_builds_validates_and_simulates(p, chunks, groups, comm):
    schedule = build("interleaved-1f1b", p, p * groups, chunks=chunks)
    validate(schedule)
    result = simulate(schedule, costs_uniform(p, 1.0, 2.0, comm_s=comm))
    if comm == 0:
        assert result.bubble_fraction == pytest.approx((p - 1) / (chunks * p * groups + p - 1))


def test_shared_links_carry_one_transfer_at_a_time():
    m, comm = 4, 1.0
    schedule = build("gpipe", 2, m)
    costs = costs_uniform(2, 0.1, 0.1, comm_s=comm)
    free = simulate(schedule, costs)
    shared = simulate(schedule, costs, shared_links=True)
    spans = sorted((e.start, e.end) for e in shared.timeline if e.kind.startswith("send_"))
    assert len(spans) == 2 * m
    assert all(a_end <= b_start + 1e-12 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    assert shared.iteration_time_s >= 2 * m * comm  # every activation and gradient crosses the one link
    assert free.iteration_time_s < 2 * m * comm  # side by side they overlap


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_batched_weight_gradients_cost_their_batched_time_per_microbatch(name):
    """p = 2, m = 8, F = 1, BI = 0.8: the last BI of stage 0 ends after (m + p - 1)(F + BI) (the
    backward pass starts as the forwards finish: gpipe, and 1f1b with BI holding up the next
    forward likewise), then W(-1) runs m x its batched cost."""
    p, m, bi, w_each, w_batched = 2, 8, 0.8, 1.2, 0.5
    schedule = build(name, p, m, batch_weight_grads=True)
    costs = costs_uniform(p, FWD, BWD, bwd_input_s=bi, bwd_weight_s=w_each, bwd_weight_batched_s=w_batched)
    result = simulate(schedule, costs)
    ws = [e for e in result.timeline if e.kind == Kind.BACKWARD_WEIGHT.value]
    assert len(ws) == p and all(e.microbatch == -1 for e in ws)
    assert all(e.end - e.start == pytest.approx(m * w_batched) for e in ws)
    if name == "gpipe":
        assert result.iteration_time_s == pytest.approx((m + p - 1) * (FWD + bi) + m * w_batched)
    # without a batched cost, W(-1) costs m per-microbatch Ws
    plain = simulate(schedule, costs_uniform(p, FWD, BWD, bwd_input_s=bi, bwd_weight_s=w_each))
    assert plain.iteration_time_s == pytest.approx(result.iteration_time_s + m * (w_each - w_batched))
    assert replace(costs[0], bwd_weight_batched_s=None).w_batched_s == w_each
    assert costs[0].scaled(0.5).w_batched_s == pytest.approx(w_batched / 2)


def test_batched_weight_gradients_in_pipedream_cover_one_minibatch_each():
    p, m = 3, 9
    costs = costs_uniform(p, FWD, BWD, bwd_input_s=1.0, bwd_weight_s=1.0, bwd_weight_batched_s=0.25)
    result = simulate(build("pipedream", p, m, batch_weight_grads=True), costs)
    ws = [e for e in result.timeline if e.kind == Kind.BACKWARD_WEIGHT.value]
    assert len(ws) == p * m and all(e.end - e.start == pytest.approx(0.25) for e in ws)


def test_batched_weight_gradients_in_pipedream_batches_cover_the_batch():
    from pipeboard.trainer.schedule.async_1f1b import build_pipedream

    p, m, per_update = 3, 12, 4
    schedule = build_pipedream(p, m, per_update, batch_weight_grads=True)
    validate(schedule)
    costs = costs_uniform(p, FWD, BWD, bwd_input_s=1.0, bwd_weight_s=1.0, bwd_weight_batched_s=0.25)
    ws = [e for e in simulate(schedule, costs).timeline if e.kind == Kind.BACKWARD_WEIGHT.value]
    assert len(ws) == p * m // per_update and all(e.end - e.start == pytest.approx(per_update * 0.25) for e in ws)


@pytest.mark.parametrize("per_update,kw", [(1, {}), (4, {}), (4, {"batch_weight_grads": True}),
                                           (2, {"replicas": [1, 2, 1]}), (6, {"vertical_sync": True})])
def test_pipedream_timeline_steps_count_batches_as_the_runtime_does(per_update, kw):
    """A pipedream step is one batch of per_update microbatches and one update; a W(-1), all-reduce
    or step belongs to the batch of the work before it, so each worker's k-th STEP is in step k."""
    p, m = 3, 12
    schedule = build("pipedream", p, m, per_update=per_update, **kw)
    timeline = simulate(schedule, costs_uniform(p, FWD, BWD, comm_s=0.1, step_s=0.05)).timeline
    assert any(e.kind.startswith("send_") for e in timeline)  # transfers are numbered too
    for e in timeline:
        if e.microbatch >= 0:
            assert e.step == e.microbatch // per_update, e
    for w, spec in enumerate(schedule.workers):
        # a worker's own events come in the order it ran them
        events = [e for e in timeline if e.worker == w and not e.kind.startswith(("send_", "recv_"))]
        r = schedule.meta["replicas"][spec.stages[0]]
        steps = [e.step for e in events if e.kind == Kind.STEP.value]
        assert steps == list(range(m // max(per_update, r)))
        for before, after in zip(events, events[1:]):
            if after.microbatch < 0:  # W(-1), all-reduce, step: the batch just finished
                assert after.step == before.step
    assert max(e.step for e in timeline) == m // per_update - 1


def test_sync_timelines_are_one_step():
    timeline = simulate(build("1f1b", 3, 8, batch_weight_grads=True), costs_uniform(3, FWD, BWD)).timeline
    assert {e.step for e in timeline} == {0}
