"""PipeDream with one weight update per batch of ``per_update`` microbatches."""

from __future__ import annotations

import pytest

from pipeboard.trainer.schedule import ScheduleError, build
from pipeboard.trainer.schedule.actions import Kind
from pipeboard.trainer.schedule.async_1f1b import build_pipedream
from pipeboard.trainer.schedule.validator import validate

COMPUTE = (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT)


def compute_and_updates(actions):
    return [a for a in actions if a.kind in COMPUTE or a.kind in (Kind.STEP, Kind.ALLREDUCE)]


@pytest.mark.parametrize("stages,m,kw", [(4, 12, {}), (3, 12, {"vertical_sync": True}),
                                         (4, 12, {"replicas": [2, 1, 3, 1]}), (2, 8, {"split_backward": True})])
def test_one_microbatch_per_update_is_pipedream_per_minibatch(stages, m, kw):
    assert build_pipedream(stages, m, 1, **kw).actions == build("pipedream", stages, m, **kw).actions


@pytest.mark.parametrize("kw", [{}, {"vertical_sync": True}, {"replicas": [2, 1, 1]}])
def test_batched_weight_gradients_one_w_per_update_naming_every_pending_version(kw):
    schedule = build_pipedream(3, 24, 4, batch_weight_grads=True, **kw)
    validate(schedule)
    assert schedule.meta["batch_weight_grads"]
    for spec, acts in zip(schedule.workers, schedule.actions):
        ops = compute_and_updates(acts)
        assert not any(a.kind is Kind.BACKWARD for a in ops)
        updates = [i for i, a in enumerate(ops) if a.kind in (Kind.ALLREDUCE, Kind.STEP)]
        w = [i for i, a in enumerate(ops) if a.kind is Kind.BACKWARD_WEIGHT]
        first_of_update = [i for i in updates if ops[i - 1].kind is not Kind.ALLREDUCE]
        assert [i - 1 for i in first_of_update] == w and all(ops[i].microbatch == -1 for i in w)
    plain = build_pipedream(3, 24, 4, **kw)
    as_b = [[(a.kind if a.kind is not Kind.BACKWARD_INPUT else Kind.BACKWARD, a.microbatch, a.version)
             for a in compute_and_updates(acts) if a.kind is not Kind.BACKWARD_WEIGHT] for acts in schedule.actions]
    assert as_b == [[(a.kind, a.microbatch, a.version) for a in compute_and_updates(acts)] for acts in plain.actions]
    assert build_pipedream(3, 12, 1, batch_weight_grads=True).actions == \
        build("pipedream", 3, 12, batch_weight_grads=True).actions


@pytest.mark.parametrize("stages,m,per_update,kw", [
    (2, 16, 4, {}), (3, 16, 4, {}), (3, 16, 4, {"vertical_sync": True}), (4, 24, 8, {"vertical_sync": True}),
    (2, 16, 4, {"replicas": [2, 1]}), (3, 24, 4, {"replicas": [2, 2, 2], "vertical_sync": True}),
    (3, 12, 6, {"replicas": [2, 1, 3]}), (3, 12, 4, {"split_backward": True}),
])
def test_each_stage_steps_once_per_batch_and_versions_count_updates(stages, m, per_update, kw):
    schedule = build_pipedream(stages, m, per_update, **kw)
    report = validate(schedule)  # forwards use the current version (or the input stage's), backwards their forward's
    assert schedule.meta["per_update"] == per_update
    for spec, acts in zip(schedule.workers, schedule.actions):
        s = spec.stages[0]
        r = schedule.meta["replicas"][s]
        version, backwards = 0, 0
        for a in compute_and_updates(acts):
            if a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
                backwards += 1
            elif a.kind is Kind.STEP:
                assert backwards == per_update // r  # exactly one batch's backwards on this replica
                version, backwards = version + 1, 0
                assert a.version == version
            elif a.kind is Kind.FORWARD and not kw.get("vertical_sync"):
                assert a.version == version
        assert backwards == 0 and version == m // per_update  # the run is whole batches
    assert max(report.stashed_versions) >= 1


def test_a_batch_mixes_versions_and_each_backward_keeps_its_forwards():
    """Stage 0 of 3 admits 3 forwards: microbatches 4 and 5 (batch 1) run forward on version 0,
    before the first update, and their backwards must use version 0 too."""
    schedule = build_pipedream(3, 12, 4)
    acts = compute_and_updates(schedule.actions[0])
    fwd = {a.microbatch: a.version for a in acts if a.kind is Kind.FORWARD}
    bwd = {a.microbatch: a.version for a in acts if a.kind is Kind.BACKWARD}
    assert [fwd[i] for i in range(12)] == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert bwd == fwd
    first_step = next(i for i, a in enumerate(acts) if a.kind is Kind.STEP)
    assert [str(a) for a in acts[first_step - 1:first_step + 2]] == ["B3@s0v0", "step@s0v1", "F6@s0v1"]


def test_vertical_sync_runs_every_stage_on_the_input_stages_version_which_it_still_holds():
    schedule = build_pipedream(4, 24, 4, vertical_sync=True)
    input_version = {a.microbatch: a.version for a in schedule.actions[0] if a.kind is Kind.FORWARD}
    assert len(set(input_version.values())) > 2
    for w in range(1, 4):
        version = 0
        for a in compute_and_updates(schedule.actions[w]):
            if a.kind is Kind.STEP:
                version = a.version
            elif a.kind in (Kind.FORWARD, Kind.BACKWARD):
                assert a.version == input_version[a.microbatch]
                if a.kind is Kind.FORWARD:
                    assert a.version <= version  # already produced by this stage
    report = validate(schedule)
    assert report.stashed_versions[1:] == [report.stashed_versions[0]] * 3  # later stages hold as many as the input stage


def test_replicas_all_reduce_and_step_after_the_round_that_ends_a_batch():
    schedule = build_pipedream(2, 16, 4, replicas=[2, 1])
    for w in (0, 1):
        ops = [a.kind for a in compute_and_updates(schedule.actions[w])]
        assert ops.count(Kind.ALLREDUCE) == ops.count(Kind.STEP) == 4
        for i, kind in enumerate(ops):
            if kind is Kind.ALLREDUCE:
                assert ops[i + 1] is Kind.STEP and ops[i - 1] is Kind.BACKWARD
    # per_update = 1 keeps PipeDream's replicas averaging one minibatch each: one update per round
    rounds = build_pipedream(2, 6, 1, replicas=[2, 1])
    assert [a.kind for a in rounds.actions[0]].count(Kind.STEP) == 3


@pytest.mark.parametrize("args,kw,match", [
    ((2, 10, 4), {}, "whole number of batches"),
    ((2, 12, 4), {"replicas": [3, 1]}, "multiple of stage 0's replicas"),
    ((2, 12, 6), {"replicas": [1, 4]}, "multiple of stage 1's replicas"),
    ((2, 12, 4), {"replicas": [2, 1], "vertical_sync": True}, "same replica count"),
    ((2, 12, 0), {}, "per_update"),
    ((2, 12, 4), {"split_backward": True, "batch_weight_grads": True}, "exclude each other"),
])
def test_impossible_batches_are_refused_naming_the_rule(args, kw, match):
    with pytest.raises(ScheduleError, match=match):
        build_pipedream(*args, **kw)
