"""Builders: every schedule validates, ranks and replicas follow the conventions, memory as the papers say."""

from __future__ import annotations

import pytest

from pipeboard.trainer.schedule import SCHEDULES, Action, Kind, Schedule, ScheduleError, build
from pipeboard.trainer.schedule.validator import validate

CASES = [
    ("gpipe", 4, 6, {}),
    ("1f1b", 4, 6, {}),
    ("1f1b", 4, 2, {}),  # fewer microbatches than stages
    ("1f1b", 4, 8, {"split_backward": True}),
    ("interleaved-1f1b", 4, 8, {"chunks": 2}),
    ("interleaved-1f1b", 2, 4, {"chunks": 3}),
    ("interleaved-1f1b", 1, 3, {"chunks": 2}),  # every chunk on one worker
    ("zb-h1", 4, 8, {}),
    ("zb-h1", 3, 2, {}),
    ("pipedream", 4, 12, {}),
    ("pipedream", 4, 12, {"vertical_sync": True}),
    ("dp", 3, 7, {}),
    ("gpipe", 3, 7, {"replicas": [1, 2, 3]}),
    ("1f1b", 4, 9, {"replicas": [1, 2, 3, 1]}),
    ("zb-h1", 3, 8, {"replicas": [2, 1, 2]}),
    ("pipedream", 4, 12, {"replicas": [2, 1, 3, 1]}),
    ("pipedream", 3, 12, {"replicas": [2, 2, 2], "vertical_sync": True}),
    # receives that no sinking can settle: those workers keep the placement's order
    ("zb-h1", 3, 6, {"replicas": [1, 3, 1]}),
    ("pipedream", 6, 12, {"replicas": [1, 1, 3, 2, 1, 1]}),
]


def computes(schedule: Schedule, w: int) -> list[Action]:
    return [a for a in schedule.actions[w] if a.kind.is_compute]


@pytest.mark.parametrize("name,p,m,kw", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-{c[3]}" for c in CASES])
def test_every_schedule_validates_and_round_trips(name, p, m, kw):
    schedule = build(name, p, m, **kw)
    report = validate(schedule)
    assert report.workers == len(schedule.workers) == len(schedule.actions)
    assert Schedule.from_dict(schedule.to_dict()) == schedule


def test_ranks_are_stage_major_and_microbatches_round_robin():
    schedule = build("1f1b", 3, 7, replicas=[1, 2, 3])
    assert [(w.rank, w.stages, w.replica) for w in schedule.workers] == [
        (0, (0,), 0), (1, (1,), 0), (2, (1,), 1), (3, (2,), 0), (4, (2,), 1), (5, (2,), 2),
    ]  # fmt: skip
    assert sorted(a.microbatch for a in computes(schedule, 4) if a.kind is Kind.FORWARD) == [1, 4]
    # replicas all-reduce before their single step; unreplicated stage 0 just steps
    tails = [[a.kind for a in acts[-2:]] for acts in schedule.actions]
    assert tails[0][-1] is Kind.STEP and tails[0][0] is not Kind.ALLREDUCE
    assert all(t == [Kind.ALLREDUCE, Kind.STEP] for t in tails[1:])
    assert schedule.actions[3][-2].group == (3, 4, 5)


def test_sends_name_the_worker_that_consumes():
    schedule = build("gpipe", 2, 4, replicas=[1, 2])
    sends = [a for a in schedule.actions[0] if a.kind is Kind.SEND_ACT]
    assert [(a.microbatch, a.peer) for a in sends] == [(0, 1), (1, 2), (2, 1), (3, 2)]


def test_1f1b_holds_p_minus_s_activations_while_gpipe_holds_m():
    p, m = 5, 12
    assert validate(build("1f1b", p, m)).peak_activations == [p - s for s in range(p)]
    assert validate(build("gpipe", p, m)).peak_activations == [m] * p


def test_1f1b_order_is_warmup_then_one_forward_one_backward():
    schedule = build("1f1b", 4, 8)
    order = [f"{a.kind.value}{a.microbatch}" for a in computes(schedule, 1)]
    assert order == ["F0", "F1", "F2", "B0", "F3", "B1", "F4", "B2", "F5", "B3", "F6", "B4", "F7", "B5", "B6", "B7"]


def test_pipedream_stashes_noam_versions_per_stage():
    """PipeDream: stage s keeps one weight version per minibatch in flight, NOAM_s = p - s."""
    p = 4
    report = validate(build("pipedream", p, 16))
    assert report.stashed_versions == [p - s for s in range(p)]
    assert report.peak_activations == [p - s for s in range(p)]
    # replicated input stage: NOAM = ceil(workers / input replicas) = ceil(5 / 2) = 3
    replicated = build("pipedream", 4, 16, replicas=[2, 1, 1, 1])
    assert replicated.meta["noam"] == [3, 3, 2, 1]
    assert validate(replicated).stashed_versions == [3, 3, 3, 2, 1]


def test_pipedream_backward_uses_the_version_its_forward_used():
    schedule = build("pipedream", 3, 10)
    for w in range(3):
        fwd = {a.microbatch: a.version for a in schedule.actions[w] if a.kind is Kind.FORWARD}
        bwd = {a.microbatch: a.version for a in schedule.actions[w] if a.kind is Kind.BACKWARD}
        assert fwd == bwd
        steps = [a.version for a in schedule.actions[w] if a.kind is Kind.STEP]
        assert steps == list(range(1, 11))  # one update per minibatch, in order
    # the input stage runs minibatch NOAM + k on the version after k updates
    assert [a.version for a in schedule.actions[0] if a.kind is Kind.FORWARD] == [0, 0, 0, 1, 2, 3, 4, 5, 6, 7]


def test_vertical_sync_uses_the_input_stage_version_everywhere():
    schedule = build("pipedream", 4, 12, vertical_sync=True)
    input_version = {a.microbatch: a.version for a in schedule.actions[0] if a.kind is Kind.FORWARD}
    for w in range(1, 4):
        used = {a.microbatch: a.version for a in schedule.actions[w] if a.kind is Kind.FORWARD}
        assert used == input_version
    # later stages must now keep as many versions as the input stage
    assert validate(schedule).stashed_versions == [4, 4, 4, 4]


def test_pipedream_replicas_all_reduce_every_round():
    schedule = build("pipedream", 2, 6, replicas=[2, 1])
    for w in (0, 1):
        kinds = [a.kind for a in schedule.actions[w] if a.kind not in (Kind.SEND_GRAD, Kind.RECV_GRAD, Kind.SEND_ACT, Kind.RECV_ACT)]
        assert kinds.count(Kind.ALLREDUCE) == kinds.count(Kind.STEP) == 3
        for i, k in enumerate(kinds):
            if k is Kind.STEP:
                assert kinds[i - 1] is Kind.ALLREDUCE


def test_zb_h1_delays_weight_gradients_on_later_stages():
    schedule = build("zb-h1", 4, 8)
    order0 = [f"{a.kind.value}{a.microbatch}" for a in computes(schedule, 0)]
    order3 = [f"{a.kind.value}{a.microbatch}" for a in computes(schedule, 3)]
    assert order0[4:7] == ["BI0", "W0", "F4"]  # stage 0: W right after its BI
    assert order3[:7] == ["F0", "BI0", "F1", "BI1", "F2", "BI2", "F3"]  # last stage: W three rounds later
    assert order3[7:9] == ["BI3", "W0"]
    assert max(validate(schedule).peak_activations) == 4  # 1F1B's peak: p


def test_interleaved_chunks_and_order():
    schedule = build("interleaved-1f1b", 2, 4, chunks=2)
    assert [w.stages for w in schedule.workers] == [(0, 2), (1, 3)]
    fwd0 = [(a.stage, a.microbatch) for a in computes(schedule, 0) if a.kind is Kind.FORWARD]
    assert fwd0 == [(0, 0), (0, 1), (2, 0), (2, 1), (0, 2), (0, 3), (2, 2), (2, 3)]


def test_receives_are_posted_before_the_compute_they_overlap():
    """In 1F1B the activation of microbatch i+1 is received before the backward that precedes F(i+1)."""
    for name in ("1f1b", "pipedream", "zb-h1"):
        schedule = build(name, 4, 12)
        for w in (1, 2, 3):
            acts = schedule.actions[w]
            comp = [i for i, a in enumerate(acts) if a.kind.is_compute]
            for i, a in enumerate(acts):
                if a.kind is Kind.FORWARD and a.microbatch >= 4:  # past the warm-up
                    recv = next(j for j, r in enumerate(acts) if r.kind is Kind.RECV_ACT and r.microbatch == a.microbatch)
                    before = comp[comp.index(i) - 1]
                    assert recv < before, (name, w, str(a), str(acts[before]))


@pytest.mark.parametrize(
    "args,kw,message",
    [
        (("nope", 4, 8), {}, "schedule must be one of"),
        (("1f1b", 0, 8), {}, "num_stages"),
        (("1f1b", 4, 0), {}, "microbatches"),
        (("1f1b", 4, 8), {"chunks": 2}, "chunks"),
        (("interleaved-1f1b", 4, 6), {"chunks": 2}, "multiple of stages"),
        (("interleaved-1f1b", 2, 4), {"chunks": 2, "replicas": [2, 1]}, "replicas"),
        (("1f1b", 3, 8), {"replicas": [1, 2]}, "one count per stage"),
        (("1f1b", 2, 8), {"replicas": [1, 0]}, ">= 1"),
        (("pipedream", 2, 7), {"replicas": [2, 1]}, "multiple of stage 0's replicas"),
        (("zb-h1", 4, 8), {"split_backward": False}, "split_backward"),
        (("1f1b", 4, 8), {"vertical_sync": True}, "vertical_sync"),
        (("dp", 4, 8), {"replicas": [2, 2]}, "one stage"),
        (("pipedream", 2, 12), {"replicas": [2, 1], "vertical_sync": True}, "same replica count"),
        (("1f1b", 64, 10**6), {}, "more than this builder handles"),
        (("1f1b", 4, 8), {"per_update": 2}, "'pipedream' only"),
        (("gpipe", 4, 8), {"per_update": 8}, "'pipedream' only"),
        (("pipedream", 2, 12), {"per_update": 5}, "whole number of batches of 5"),
        (("pipedream", 2, 12), {"per_update": 3, "replicas": [2, 1]}, "multiple of stage 0's replicas"),
    ],
)
def test_bad_arguments_name_the_problem(args, kw, message):
    with pytest.raises(ScheduleError, match=message):
        build(*args, **kw)


def test_every_name_builds():
    for name in SCHEDULES:
        kw = {"chunks": 2} if name == "interleaved-1f1b" else {}
        validate(build(name, 2, 4, **kw))


POINT_TO_POINT = (Kind.SEND_ACT, Kind.RECV_ACT, Kind.SEND_GRAD, Kind.RECV_GRAD)
BATCHED = [
    ("gpipe", 3, 6, {}),
    ("1f1b", 4, 8, {}),
    ("1f1b", 4, 9, {"replicas": [1, 2, 3, 1]}),
    ("interleaved-1f1b", 2, 4, {"chunks": 2}),
    ("pipedream", 4, 12, {}),
    ("pipedream", 4, 12, {"vertical_sync": True}),
    ("pipedream", 4, 12, {"replicas": [2, 1, 3, 1]}),
    ("pipedream", 4, 12, {"per_update": 4}),
    ("pipedream", 4, 12, {"per_update": 4, "replicas": [2, 1, 2, 1]}),
]


@pytest.mark.parametrize("name,p,m,kw", BATCHED, ids=[f"{c[0]}-{c[1]}x{c[2]}-{c[3]}" for c in BATCHED])
def test_batched_weight_grads_turn_each_b_into_bi_with_one_w_before_each_update(name, p, m, kw):
    plain = build(name, p, m, **kw)
    schedule = build(name, p, m, batch_weight_grads=True, **kw)
    validate(schedule)
    assert schedule.meta["batch_weight_grads"] and not plain.meta["batch_weight_grads"]
    for w, (acts, ref) in enumerate(zip(schedule.actions, plain.actions)):
        assert not any(a.kind is Kind.BACKWARD for a in acts)
        # the same computes and updates with B renamed BI, once the W(-1) are taken out
        # (transfers may sit elsewhere: they are placed for BI's shorter time)
        bare = [a for a in acts if a.kind is not Kind.BACKWARD_WEIGHT and a.kind not in POINT_TO_POINT]
        assert [(Kind.BACKWARD if a.kind is Kind.BACKWARD_INPUT else a.kind, a.stage, a.microbatch, a.version)
                for a in bare] == [(a.kind, a.stage, a.microbatch, a.version) for a in ref
                                   if a.kind not in POINT_TO_POINT]
        held = {}
        work = [a for a in acts if a.kind not in POINT_TO_POINT]  # receives may be posted in between
        for i, a in enumerate(work):
            if a.kind is Kind.BACKWARD_WEIGHT:
                assert a.microbatch == -1 and a.version == held.get(a.stage, 0)
                nxt = work[i + 1]  # the update follows at once: the all-reduce, else the step
                assert nxt.kind in (Kind.ALLREDUCE, Kind.STEP) and nxt.stage == a.stage
            if a.kind is Kind.STEP:
                held[a.stage] = a.version
                before = work[i - 1] if work[i - 1].kind is not Kind.ALLREDUCE else work[i - 2]
                assert before.kind is Kind.BACKWARD_WEIGHT, f"worker {w}: {a} without a W(-1) before its update"


@pytest.mark.parametrize("name", ["dp", "zb-h1"])
def test_batched_weight_grads_leave_dp_and_zb_h1_as_they_are(name):
    schedule = build(name, 3, 6, batch_weight_grads=True)
    assert schedule.actions == build(name, 3, 6).actions
    assert not schedule.meta["batch_weight_grads"]


def test_batched_and_split_backward_exclude_each_other():
    with pytest.raises(ScheduleError, match="exclude each other"):
        build("1f1b", 2, 4, batch_weight_grads=True, split_backward=True)


def test_batched_weight_grads_keep_every_microbatch_until_the_w():
    """What BI leaves for W (layer inputs and output gradients) stays until W(-1): 1F1B then
    holds all M microbatches like GPipe, and pipedream (one update per microbatch) as before."""
    assert validate(build("1f1b", 4, 8, batch_weight_grads=True)).peak_activations == [8] * 4
    plain = validate(build("pipedream", 4, 12)).peak_activations
    assert validate(build("pipedream", 4, 12, batch_weight_grads=True)).peak_activations == plain


@pytest.mark.parametrize("kw", [{}, {"batch_weight_grads": True}, {"vertical_sync": True},
                                {"replicas": [2, 1, 2]}, {"split_backward": True}])
def test_pipedream_per_update_is_one_build_path(kw):
    """build_pipedream is build("pipedream", per_update=...): same actions, same meta."""
    from pipeboard.trainer.schedule.async_1f1b import build_pipedream

    for per_update in (1, 2, 6):
        schedule = build("pipedream", 3, 12, per_update=per_update, **kw)
        twin = build_pipedream(3, 12, per_update, **kw)
        assert schedule.actions == twin.actions and schedule.meta == twin.meta
        assert schedule.meta["per_update"] == per_update
        validate(schedule)
        # an update is one batch, or one round of the replicas when a batch is less than a round
        r = kw.get("replicas", [1])[0]
        steps = [a for a in schedule.actions[0] if a.kind is Kind.STEP]
        assert len(steps) == 12 // max(per_update, r)
    assert build("pipedream", 3, 12).meta["per_update"] == 1  # PipeDream's original by default
    assert "per_update" not in build("1f1b", 3, 12).meta  # a sync iteration is the update


def test_a_receive_that_no_compute_uses_is_a_schedule_error():
    """Worker 1 never runs microbatch 1, which worker 0 still sends it: one line naming the worker."""
    from pipeboard.trainer.schedule import registry

    def programs(ctx):
        return [
            [Action(Kind.FORWARD, 0, 0), Action(Kind.FORWARD, 0, 1), Action(Kind.BACKWARD, 0, 0),
             Action(Kind.STEP, 0, -1, 1)],
            [Action(Kind.FORWARD, 1, 0), Action(Kind.BACKWARD, 1, 0), Action(Kind.STEP, 1, -1, 1)],
        ]

    registry.register("tmp-lossy", programs, description="Drops microbatch 1 on stage 1.")
    try:
        with pytest.raises(ScheduleError, match="worker 1 receives data that none of its computes uses"):
            build("tmp-lossy", 2, 2)
    finally:
        registry.unregister("tmp-lossy")


@pytest.mark.parametrize("program", [[], [Action(Kind.STEP, 0, -1, 1)]])
def test_a_worker_with_fewer_than_two_actions_keeps_its_list(program):
    """The hoisting picks each column out with one itemgetter, which takes a list of two or more."""
    from pipeboard.trainer.schedule import registry

    registry.register("tmp-short", lambda ctx: [list(program)], description="One worker, at most one action.")
    try:
        assert build("tmp-short", 1, 1).actions == [program]
    finally:
        registry.unregister("tmp-short")
