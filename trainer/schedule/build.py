"""``build(name, ...)``: the one entry point that turns a schedule name into a ``Schedule``."""

from __future__ import annotations

from trainer.schedule import topology as topo_mod
from trainer.schedule.actions import Schedule, ScheduleError
from trainer.schedule.engine import gc_paused
from trainer.schedule.hoist import hoist_receives
from trainer.schedule.flush import batch_weight_grads as batch_weights, gpipe_ops, one_f_one_b_ops
from trainer.schedule.interleaved import interleaved_programs
from trainer.schedule.pipedream import pipedream_programs
from trainer.schedule.placement import StaticPolicy, place
from trainer.schedule.zerobubble import zero_bubble_ops

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "pipedream", "dp")
MAX_UNITS = 1 << 20  # (virtual stage, microbatch) pairs: ~3 M actions, seconds to build, 1-2 GB
SYNC = {"gpipe": True, "1f1b": True, "interleaved-1f1b": True, "zb-h1": True, "pipedream": False, "dp": True}


def names() -> tuple[str, ...]:
    return SCHEDULES


def build(
    name: str,
    num_stages: int,
    microbatches: int,
    *,
    replicas: list[int] | None = None,
    chunks: int = 1,
    vertical_sync: bool = False,
    split_backward: bool | None = None,
    batch_weight_grads: bool = False,
    per_update: int = 1,
) -> Schedule:
    """The action lists of schedule ``name``.

    ``num_stages`` physical stages (for ``dp``: the number of data-parallel workers), each with
    ``replicas[s]`` workers; ``microbatches`` per iteration (sync schedules) or in total
    (``pipedream``, which updates once per ``per_update`` of them). ``chunks`` model chunks per worker for ``interleaved-1f1b``.
    ``split_backward`` splits each backward into BI and W (default: only for ``zb-h1``).
    ``batch_weight_grads``: each backward is a BI and one ``W(-1)`` right before each update of
    the stage computes the weight gradients of all of them (batched); ignored for ``dp`` (its
    all-reduce runs inside the backward) and ``zb-h1`` (its W are placed one by one).
    ``per_update``: ``pipedream`` only, microbatches per weight update (one batch); 1 is
    PipeDream's original, one update per minibatch; a pipedream schedule's
    ``meta["per_update"]`` says it (a sync schedule updates once per iteration).
    """
    if name not in SCHEDULES:
        raise ScheduleError(f"schedule must be one of {', '.join(SCHEDULES)}; got {name!r}")
    if microbatches < 1:
        raise ScheduleError(f"microbatches must be >= 1, got {microbatches}")
    if chunks < 1:
        raise ScheduleError(f"chunks must be >= 1, got {chunks}")
    units = (1 if name == "dp" else num_stages) * chunks * microbatches
    if units > MAX_UNITS:
        raise ScheduleError(
            f"microbatches x stages x chunks = {units} is more than this builder handles ({MAX_UNITS})"
        )
    if chunks > 1 and name != "interleaved-1f1b":
        raise ScheduleError(f"chunks > 1 needs schedule 'interleaved-1f1b', not {name!r}")
    if per_update != 1 and name != "pipedream":
        raise ScheduleError(f"per_update (microbatches per weight update) applies to schedule 'pipedream' only; "
                            f"{name!r} updates once per iteration of its microbatches")
    if vertical_sync and name != "pipedream":
        raise ScheduleError("vertical_sync applies to schedule 'pipedream' only")
    split = (name == "zb-h1") if split_backward is None else bool(split_backward)
    if name == "zb-h1" and not split:
        raise ScheduleError("zb-h1 needs split_backward (its point is running W apart from BI)")
    batch = bool(batch_weight_grads) and name not in ("dp", "zb-h1")
    if batch and split:
        raise ScheduleError("batch_weight_grads and split_backward exclude each other: "
                            "the weight gradients are either batched before the update or run one by one")

    if name == "dp":
        if replicas is not None and len(replicas) != 1:
            raise ScheduleError(f"dp has one stage: replicas must be [workers], got {replicas}")
        topo = topo_mod.replicated(1, replicas if replicas is not None else [num_stages])
    elif name == "interleaved-1f1b":
        if replicas is not None and any(r != 1 for r in replicas):
            raise ScheduleError("interleaved-1f1b does not replicate stages: replicas must all be 1")
        topo = topo_mod.interleaved(num_stages, chunks)
    else:
        topo = topo_mod.replicated(num_stages, replicas)

    with gc_paused():
        if name == "pipedream":
            programs = pipedream_programs(topo, microbatches, vertical_sync, split, per_update)
        elif name == "interleaved-1f1b" and chunks > 1:
            programs = interleaved_programs(topo, num_stages, chunks, microbatches, split)
        elif name == "zb-h1":
            programs = [zero_bubble_ops(topo, w.rank, w.stages[0], microbatches) for w in topo.workers]
        else:
            make = gpipe_ops if name == "gpipe" else one_f_one_b_ops
            programs = [make(topo, w.rank, w.stages[0], microbatches, split) for w in topo.workers]
        if batch:
            programs = [batch_weights(p) for p in programs]
        actions = hoist_receives(*place(topo, [StaticPolicy(p) for p in programs]))
    meta = {
        "sync": SYNC[name],
        "physical_stages": 1 if name == "dp" else num_stages,
        "chunks": chunks,
        "replicas": [topo.replicas(s) for s in range(topo.num_stages)] if chunks == 1 else [1] * num_stages,
        "split_backward": split,
        "batch_weight_grads": batch,
        "vertical_sync": vertical_sync,
        "noam": [topo.noam(s) for s in range(topo.num_stages)] if chunks == 1 else None,
    }
    if name == "pipedream":
        meta["per_update"] = per_update
    return Schedule(name, topo.num_stages, microbatches, list(topo.workers), actions, meta)
