"""The validator rejects broken schedules and finds deadlocks in the all-blocking model."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest

from pipeboard.trainer.schedule import Action, Kind, Schedule, ScheduleError, WorkerSpec, build
from pipeboard.trainer.schedule.validator import validate

F, B, SA, RA, SG, RG, ST = Kind.FORWARD, Kind.BACKWARD, Kind.SEND_ACT, Kind.RECV_ACT, Kind.SEND_GRAD, Kind.RECV_GRAD, Kind.STEP


def two_stage(w0: list[Action], w1: list[Action], m: int = 1) -> Schedule:
    return Schedule("hand", 2, m, [WorkerSpec(0, (0,)), WorkerSpec(1, (1,))], [w0, w1], {"sync": True})


GOOD0 = [Action(F, 0, 0), Action(SA, 0, 0, peer=1), Action(RG, 0, 0, peer=1), Action(B, 0, 0), Action(ST, 0, -1, 1)]
GOOD1 = [Action(RA, 1, 0, peer=0), Action(F, 1, 0), Action(B, 1, 0), Action(SG, 1, 0, peer=0), Action(ST, 1, -1, 1)]


def test_a_hand_written_schedule_passes():
    report = validate(two_stage(GOOD0, GOOD1))
    assert report.peak_activations == [1, 1]
    assert report.stashed_versions == [1, 1]


def test_receiving_before_sending_on_both_sides_deadlocks():
    w0 = [GOOD0[0], GOOD0[2], GOOD0[1], *GOOD0[3:]]  # waits for the gradient before sending the activation
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(two_stage(w0, GOOD1))


def test_messages_out_of_order_deadlock_with_blocking_sends():
    w0 = [Action(F, 0, 0), Action(F, 0, 1), Action(SA, 0, 0, peer=1), Action(SA, 0, 1, peer=1),
          Action(RG, 0, 0, peer=1), Action(B, 0, 0), Action(RG, 0, 1, peer=1), Action(B, 0, 1), Action(ST, 0, -1, 1)]
    w1 = [Action(RA, 1, 1, peer=0), Action(RA, 1, 0, peer=0), Action(F, 1, 0), Action(F, 1, 1),
          Action(B, 1, 0), Action(SG, 1, 0, peer=0), Action(B, 1, 1), Action(SG, 1, 1, peer=0), Action(ST, 1, -1, 1)]  # fmt: skip
    with pytest.raises(ScheduleError, match="out of order"):
        validate(two_stage(w0, w1, m=2))


@pytest.mark.parametrize(
    "w0,w1,message",
    [
        (GOOD0, [GOOD1[1], *GOOD1[2:]], "before its input"),  # forward without receiving
        (GOOD0[:3] + GOOD0[4:], GOOD1, "missing B0@s0"),  # a backward missing
        ([GOOD0[3], *GOOD0], GOOD1, "twice"),  # a duplicate compute
        (GOOD0, [GOOD1[0], GOOD1[2], GOOD1[1], *GOOD1[3:]], "before its forward"),
        (GOOD0[:4] + [Action(ST, 0, -1, 2)], GOOD1, "version 2 after 0"),  # an update skipped
        (GOOD0[:3] + [Action(B, 0, 0, version=1)] + GOOD0[4:], GOOD1, "weight stashing"),
        (GOOD0, GOOD1[:3] + [Action(SG, 1, 0, peer=1)] + GOOD1[4:], "peer 1"),  # sends to itself
        ([Action(F, 1, 0), *GOOD0], GOOD1, "holds stages"),
        (GOOD0, GOOD1[:1] + [Action(F, 1, 0, version=3)] + GOOD1[2:], "weight version 3"),
    ],
)
def test_broken_schedules_are_rejected(w0, w1, message):
    with pytest.raises(ScheduleError, match=message):
        validate(two_stage(w0, w1))


def test_a_send_to_the_wrong_replica_is_rejected():
    schedule = build("1f1b", 2, 4, replicas=[1, 2])
    acts = schedule.actions[0]
    i = next(i for i, a in enumerate(acts) if a.kind is SA and a.microbatch == 1)
    acts[i] = replace(acts[i], peer=1)  # microbatch 1 belongs to replica 1 (worker 2)
    with pytest.raises(ScheduleError, match="worker 2 runs its consumer"):
        validate(schedule)


def test_replicas_must_all_reduce_before_stepping():
    schedule = build("gpipe", 2, 4, replicas=[1, 2])
    for w in (1, 2):
        schedule.actions[w] = [a for a in schedule.actions[w] if a.kind is not Kind.ALLREDUCE]
    with pytest.raises(ScheduleError, match="without an all-reduce"):
        validate(schedule)


def test_an_all_reduce_missing_on_one_replica_deadlocks():
    schedule = build("1f1b", 2, 4, replicas=[1, 2])
    schedule.actions[2] = [a for a in schedule.actions[2] if a.kind is not Kind.ALLREDUCE]
    with pytest.raises(ScheduleError, match="deadlock|all-reduce"):
        validate(schedule)


def test_random_reorderings_of_a_worker_are_caught_or_valid():
    """Swapping two neighbouring actions either still runs or is rejected, never silently wrong."""
    rng = random.Random(5)
    base = build("1f1b", 3, 5)
    rejected = 0
    for _ in range(60):
        schedule = copy.deepcopy(base)
        w = rng.randrange(3)
        i = rng.randrange(len(schedule.actions[w]) - 1)
        acts = schedule.actions[w]
        acts[i], acts[i + 1] = acts[i + 1], acts[i]
        try:
            report = validate(schedule)
        except ScheduleError:
            rejected += 1
            continue
        assert len(report.peak_activations) == 3
    assert rejected > 0


BI, W = Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT
SPLIT0 = [Action(F, 0, 0), Action(SA, 0, 0, peer=1), Action(RG, 0, 0, peer=1), Action(BI, 0, 0),
          Action(W, 0, -1), Action(ST, 0, -1, 1)]
SPLIT1 = [Action(RA, 1, 0, peer=0), Action(F, 1, 0), Action(BI, 1, 0), Action(SG, 1, 0, peer=0),
          Action(W, 1, 0), Action(ST, 1, -1, 1)]


def test_batched_and_per_microbatch_weight_gradients_pass():
    assert validate(two_stage(SPLIT0, SPLIT1)).peak_activations == [1, 1]


@pytest.mark.parametrize(
    "w0,w1,message",
    [
        (SPLIT0[:4] + [Action(W, 0, -1), Action(W, 0, -1)] + SPLIT0[5:], SPLIT1, "no BI of stage 0 pending"),
        ([Action(W, 0, -1)] + SPLIT0[:4] + SPLIT0[5:], SPLIT1, "no BI of stage 0 pending"),
        (SPLIT0[:4] + [SPLIT0[5], SPLIT0[4]], SPLIT1, "before the weight gradients"),  # update first
        (SPLIT0[:4] + SPLIT0[5:], SPLIT1, "before the weight gradients"),  # no W at all
        (SPLIT0[:4], SPLIT1, "never get their weight gradients"),  # no W before the end
        (SPLIT0[:5] + [Action(W, 0, 0)] + SPLIT0[5:], SPLIT1, "already covered"),
        (SPLIT0[:4] + [Action(W, 0, -1, version=1)] + SPLIT0[5:], SPLIT1, "holds 0"),
        (SPLIT0, SPLIT1[:2] + [Action(W, 1, 0)] + SPLIT1[2:4] + SPLIT1[5:], "before its BI"),
    ],
)
def test_broken_weight_gradient_orders_are_rejected(w0, w1, message):
    with pytest.raises(ScheduleError, match=message):
        validate(two_stage(w0, w1))


def test_an_all_reduce_needs_the_weight_gradients_first():
    schedule = build("gpipe", 2, 4, replicas=[1, 2], batch_weight_grads=True)
    acts = schedule.actions[1]
    i = next(i for i, a in enumerate(acts) if a.kind is W)
    acts[i], acts[i + 1] = acts[i + 1], acts[i]  # ALLREDUCE before W(-1)
    with pytest.raises(ScheduleError, match="before the weight gradients"):
        validate(schedule)


def test_some_backwards_split_and_others_full_pass_but_not_both_for_one_microbatch():
    """DualPipeV splits only its last backwards: each (stage, microbatch) needs one B or one BI."""
    BI, W = Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT
    w0 = [Action(F, 0, 0), Action(SA, 0, 0, peer=1), Action(F, 0, 1), Action(RG, 0, 0, peer=1),
          Action(SA, 0, 1, peer=1), Action(B, 0, 0), Action(RG, 0, 1, peer=1), Action(BI, 0, 1), Action(W, 0, 1),
          Action(ST, 0, -1, 1)]
    w1 = [Action(RA, 1, 0, peer=0), Action(F, 1, 0), Action(BI, 1, 0), Action(SG, 1, 0, peer=0), Action(W, 1, 0),
          Action(RA, 1, 1, peer=0), Action(F, 1, 1), Action(B, 1, 1), Action(SG, 1, 1, peer=0), Action(ST, 1, -1, 1)]
    assert validate(two_stage(w0, w1, m=2)).workers == 2
    both = w0[:6] + [Action(BI, 0, 0)] + w0[6:]
    with pytest.raises(ScheduleError, match="B0@s0 and BI0@s0 both compute one input gradient"):
        validate(two_stage(both, w1, m=2))
    neither = [a for a in w0 if not (a.kind is BI or a.kind is W)]
    with pytest.raises(ScheduleError, match="missing BI1@s0: no worker runs it"):
        validate(two_stage(neither, w1, m=2))
