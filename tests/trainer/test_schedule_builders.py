"""The schedule builders (flush, interleaved, zerobubble, pipedream) and ``build`` on properties
the papers and trainer/schedule/actions.py state, for cases mutation testing
(docs/mutation-testing.md) found untested:

- actions not tied to a microbatch (STEP, ALLREDUCE) carry microbatch -1 on every schedule; a
  sync schedule's all-reduce names the version it reduces (0), its step the one it makes (1);
- ``split_backward`` splits every backward of every schedule that takes it into BI then W;
- batching weight gradients on a program without a final update closes it with one W(-1);
- interleaved 1F1B's warm-up: worker w of p runs min(2 (p - w - 1) + (v - 1) p, v m) forwards,
  then alternates forward and backward, each chunk's microbatches in groups of p;
- 1F1B keeps at most (stages - stage) microbatches between a forward and its backward, each
  microbatch's F before its B on every stage;
- pipedream's replicas all-reduce the version they hold and step to the next one;
- ``build``'s meta, its limits (exactly MAX_UNITS units is allowed) and its messages.
"""

from __future__ import annotations

import re

import pytest

from pipeboard.trainer.schedule import Action, Kind, ScheduleError, build, registry
from pipeboard.trainer.schedule.builder import MAX_UNITS
from pipeboard.trainer.schedule.flush import batch_weight_grads, update_ops
from pipeboard.trainer.schedule.async_1f1b import pipedream_programs
from pipeboard.trainer.schedule.topology import replicated
from pipeboard.trainer.schedule.validator import validate

UPDATES = (Kind.STEP, Kind.ALLREDUCE)
SCHEDULES = [
    ("gpipe", 3, 6, {"replicas": [1, 2, 3]}),
    ("1f1b", 3, 6, {"replicas": [2, 1, 2]}),
    ("interleaved-1f1b", 2, 4, {"chunks": 2}),
    ("zb-h1", 3, 6, {"replicas": [2, 1, 2]}),
    ("pipedream", 2, 8, {"replicas": [2, 1], "per_update": 2}),
    ("dp", 3, 6, {}),
]


def computes(schedule, w: int) -> list[Action]:
    return [a for a in schedule.actions[w] if a.kind.is_compute]


@pytest.mark.parametrize("name,p,m,kw", SCHEDULES, ids=[c[0] for c in SCHEDULES])
def test_updates_are_tied_to_no_microbatch(name, p, m, kw):
    schedule = build(name, p, m, **kw)
    updates = [a for acts in schedule.actions for a in acts if a.kind in UPDATES]
    assert updates and all(a.microbatch == -1 for a in updates)
    if name != "pipedream":  # one update per iteration: reduce version 0, step to version 1
        assert {a.version for a in updates if a.kind is Kind.ALLREDUCE} <= {0}
        assert {a.version for a in updates if a.kind is Kind.STEP} == {1}
    if name in ("gpipe", "1f1b", "zb-h1", "dp"):
        assert any(a.kind is Kind.ALLREDUCE for a in updates)  # these cases replicate a stage


def test_an_update_reduces_the_version_held_and_steps_to_the_next():
    topo = replicated(2, [2, 1])
    assert update_ops(topo, 0, 3) == [Action(Kind.ALLREDUCE, 0, -1, 2, group=(0, 1)), Action(Kind.STEP, 0, -1, 3)]
    assert update_ops(topo, 1, 1) == [Action(Kind.STEP, 1, -1, 1)]  # one replica: nothing to reduce


@pytest.mark.parametrize("name,p,m,kw", [
    ("gpipe", 3, 6, {}),
    ("1f1b", 3, 6, {"replicas": [1, 2, 1]}),
    ("interleaved-1f1b", 2, 4, {"chunks": 2}),
    ("interleaved-1f1b", 2, 4, {"chunks": 1}),
    ("pipedream", 3, 6, {}),
    ("dp", 2, 4, {}),
], ids=lambda c: str(c))
def test_split_backward_splits_every_backward_into_bi_then_its_w(name, p, m, kw):
    schedule = build(name, p, m, split_backward=True, **kw)
    assert schedule.meta["split_backward"]
    validate(schedule)
    for w in range(len(schedule.workers)):
        comp = computes(schedule, w)
        assert not any(a.kind is Kind.BACKWARD for a in comp)
        bis = [i for i, a in enumerate(comp) if a.kind is Kind.BACKWARD_INPUT]
        assert bis and len(bis) == sum(a.kind is Kind.FORWARD for a in comp)
        for i in bis:  # the weight half follows its input half at once (backward_ops)
            a, nxt = comp[i], comp[i + 1]
            assert (nxt.kind, nxt.stage, nxt.microbatch, nxt.version) == (Kind.BACKWARD_WEIGHT, a.stage,
                                                                           a.microbatch, a.version)
    plain = build(name, p, m, **kw)
    assert not any(a.kind in (Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT) for acts in plain.actions for a in acts)


def test_batched_weight_grads_close_a_program_without_a_final_update():
    program = [Action(Kind.FORWARD, 1, 0), Action(Kind.BACKWARD, 1, 0), Action(Kind.FORWARD, 0, 0),
               Action(Kind.BACKWARD, 0, 0)]
    assert batch_weight_grads(program) == [
        Action(Kind.FORWARD, 1, 0), Action(Kind.BACKWARD_INPUT, 1, 0), Action(Kind.FORWARD, 0, 0),
        Action(Kind.BACKWARD_INPUT, 0, 0),
        Action(Kind.BACKWARD_WEIGHT, 0, -1, 0), Action(Kind.BACKWARD_WEIGHT, 1, -1, 0),  # stage order
    ]
    # after an update the trailing W(-1) names the version the stage then holds
    updated = [Action(Kind.FORWARD, 0, 0), Action(Kind.BACKWARD, 0, 0), Action(Kind.STEP, 0, -1, 1),
               Action(Kind.FORWARD, 0, 1, 1), Action(Kind.BACKWARD, 0, 1, 1)]
    assert batch_weight_grads(updated) == [
        Action(Kind.FORWARD, 0, 0), Action(Kind.BACKWARD_INPUT, 0, 0), Action(Kind.BACKWARD_WEIGHT, 0, -1, 0),
        Action(Kind.STEP, 0, -1, 1), Action(Kind.FORWARD, 0, 1, 1), Action(Kind.BACKWARD_INPUT, 0, 1, 1),
        Action(Kind.BACKWARD_WEIGHT, 0, -1, 1),
    ]


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (3, 2, 3), (2, 3, 4), (4, 3, 4)])
def test_interleaved_warm_up_and_chunk_order(p, v, m):
    schedule = build("interleaved-1f1b", p, m, chunks=v)
    total = v * m
    for w in range(p):
        comp = computes(schedule, w)
        warmup = min(2 * (p - w - 1) + (v - 1) * p, total)
        assert [a.kind for a in comp[:warmup]] == [Kind.FORWARD] * warmup
        # then one forward, one backward, then the drain: the warm-up's backwards
        steady = total - warmup
        assert [a.kind for a in comp[warmup:warmup + 2 * steady]] == [Kind.FORWARD, Kind.BACKWARD] * steady
        assert [a.kind for a in comp[warmup + 2 * steady:]] == [Kind.BACKWARD] * warmup
        # forward k: chunk (k // p) % v of microbatch (k // (p v)) p + k % p; backwards: chunks reversed
        fwd = [(a.stage, a.microbatch) for a in comp if a.kind is Kind.FORWARD]
        bwd = [(a.stage, a.microbatch) for a in comp if a.kind is Kind.BACKWARD]
        assert fwd == [(((k // p) % v) * p + w, (k // (p * v)) * p + k % p) for k in range(total)]
        assert bwd == [((v - 1 - (k // p) % v) * p + w, (k // (p * v)) * p + k % p) for k in range(total)]
        assert [a for a in schedule.actions[w] if a.kind is Kind.STEP] == [
            Action(Kind.STEP, s, -1, 1) for s in schedule.workers[w].stages]


@pytest.mark.parametrize("p,m", [(4, 8), (3, 2), (5, 5)])
def test_1f1b_keeps_at_most_stages_minus_stage_microbatches_in_flight(p, m):
    schedule = build("1f1b", p, m)
    for s in range(p):
        in_flight, peak, done = set(), 0, set()
        for a in computes(schedule, s):
            if a.kind is Kind.FORWARD:
                in_flight.add(a.microbatch)
                peak = max(peak, len(in_flight))
            else:
                assert a.microbatch in in_flight  # its forward came first
                in_flight.discard(a.microbatch)
                done.add(a.microbatch)
        assert peak == min(p - s, m) and done == set(range(m)) and not in_flight


def test_pipedream_replicas_reduce_the_version_they_hold():
    # Stage 0 on 2 replicas, 8 minibatches, 2 per update: every round of the 2 replicas is a batch.
    schedule = build("pipedream", 2, 8, replicas=[2, 1], per_update=2)
    for w in (0, 1):
        updates = [(a.kind, a.version) for a in schedule.actions[w] if a.kind in UPDATES]
        assert updates == [(Kind.ALLREDUCE, 0), (Kind.STEP, 1), (Kind.ALLREDUCE, 1), (Kind.STEP, 2),
                           (Kind.ALLREDUCE, 2), (Kind.STEP, 3), (Kind.ALLREDUCE, 3), (Kind.STEP, 4)]
    assert [a.version for a in schedule.actions[2] if a.kind is Kind.STEP] == [1, 2, 3, 4]


def test_pipedream_programs_update_once_per_minibatch_by_default():
    programs = pipedream_programs(replicated(2, None), 4, False, False)
    for ops in programs:
        assert [a.version for a in ops if a.kind is Kind.STEP] == [1, 2, 3, 4]
        assert not any(a.kind is Kind.ALLREDUCE for a in ops)


def test_meta_describes_the_layout():
    flat = build("1f1b", 3, 4, replicas=[1, 2, 1])
    assert (flat.meta["physical_stages"], flat.meta["chunks"], flat.meta["replicas"], flat.meta["noam"]) == (
        3, 1, [1, 2, 1], [4, 2, 1])  # noam: ceil(workers from s on / replicas of s): 4/1, 3/2, 1/1
    chunked = build("interleaved-1f1b", 2, 4, chunks=2)
    assert (chunked.meta["physical_stages"], chunked.meta["chunks"], chunked.meta["replicas"], chunked.meta["noam"]) == (
        2, 2, [1, 1], None)
    assert chunked.num_stages == 4
    dp = build("dp", 3, 4)
    assert (dp.meta["physical_stages"], dp.meta["replicas"], len(dp.workers)) == (1, [3], 3)


def test_dp_takes_its_worker_count_from_replicas():
    schedule = build("dp", 3, 4, replicas=[2])
    assert len(schedule.workers) == 2 and schedule.meta["replicas"] == [2]
    assert sorted(a.microbatch for a in computes(schedule, 1) if a.kind is Kind.FORWARD) == [1, 3]


def test_exactly_max_units_passes_the_size_check():
    # 1 x 2 x MAX_UNITS / 2 units is the limit itself: refused only for the chunks, not the size
    takers = registry.either(registry.having(chunks=True))
    with pytest.raises(ScheduleError, match=re.escape(f"chunks > 1 needs schedule {takers}, not '1f1b'")):
        build("1f1b", 1, MAX_UNITS // 2, chunks=2)
    with pytest.raises(ScheduleError, match=re.escape(
            f"microbatches x stages x chunks = {4 * MAX_UNITS} is more than this builder handles ({MAX_UNITS})")):
        build("1f1b", 2, MAX_UNITS, chunks=2)
    with pytest.raises(ScheduleError, match=re.escape(f"= {MAX_UNITS + 1} is more than")):
        build("1f1b", 1, 1, chunks=MAX_UNITS + 1)


@pytest.mark.parametrize("kw,message", [
    ({"chunks": 0}, "chunks must be >= 1, got 0"),
    ({"chunks": 2}, f"chunks > 1 needs schedule {registry.either(registry.having(chunks=True))}, not '1f1b'"),
    ({"vertical_sync": True}, "vertical_sync applies to schedule 'pipedream' only"),
    ({"split_backward": True, "batch_weight_grads": True},
     "batch_weight_grads and split_backward exclude each other: the weight gradients are either batched "
     "before the update or run one by one"),
    ({"per_update": 2}, "per_update (microbatches per weight update) applies to schedule 'pipedream' only; "
                        "'1f1b' updates once per iteration of its microbatches"),
])
def test_build_refuses_options_the_schedule_does_not_take_saying_which_do(kw, message):
    with pytest.raises(ScheduleError) as info:
        build("1f1b", 2, 2, **kw)
    assert str(info.value) == message


@pytest.mark.parametrize("m,per_update,kw,message", [
    (6, 2, {"replicas": [3, 1]},
     "microbatches per update (2) must be a multiple of stage 0's replicas (3) (or divide it) for pipedream: "
     "replicas all-reduce and step after the round that ends a batch"),
    (5, 1, {"replicas": [2, 1]},
     "microbatches (5) must be a multiple of stage 0's replicas (2) for pipedream: "
     "replicas all-reduce after each round of backwards"),
    (4, 2, {"replicas": [2, 1], "vertical_sync": True},
     "vertical_sync needs the same replica count on every stage: a version counts rounds of a stage's replicas, "
     "so versions of stages with different counts name different minibatches"),
])
def test_pipedream_refuses_batches_it_cannot_run_with_the_whole_rule(m, per_update, kw, message):
    with pytest.raises(ScheduleError) as info:
        build("pipedream", 2, m, per_update=per_update, **kw)
    assert str(info.value) == message
