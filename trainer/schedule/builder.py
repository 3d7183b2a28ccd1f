"""``build(name, ...)``: the one entry point that turns a schedule name into a ``Schedule``.

The name is looked up in the registry (registry.py); its capabilities decide which options it
takes and how its workers are laid out, its builder writes the workers' programs, and the
steps every schedule shares happen here: batched weight gradients, placing and hoisting the
receives, ``meta``.
"""

from __future__ import annotations

from pipeboard.trainer.schedule import registry
from pipeboard.trainer.schedule import topology as topo_mod
from pipeboard.trainer.schedule.actions import Action, OverlapFB, Schedule, ScheduleError
from pipeboard.trainer.schedule.engine import gc_paused
from pipeboard.trainer.schedule.flush import batch_weight_grads as batch_weights
from pipeboard.trainer.schedule.hoist import hoist_receives
from pipeboard.trainer.schedule.transfers import place
from pipeboard.trainer.schedule.registry import BuildContext, ScheduleSpec

MAX_UNITS = 1 << 20  # (virtual stage, microbatch) pairs: ~3 M actions, seconds to build, 1-2 GB


def names() -> tuple[str, ...]:
    return registry.names()


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

    ``num_stages`` physical stages (for a data-parallel schedule, ``dp``: the number of workers),
    each with ``replicas[s]`` workers; ``microbatches`` per iteration (sync schedules) or in total
    (asynchronous ones, ``pipedream``, which update once per ``per_update`` of them). ``chunks``
    model chunks per worker for a schedule that takes chunks (``interleaved-1f1b``); 1 there means
    the schedule's ``default_chunks``, as for a run (runtime/layout.py).
    ``split_backward`` splits each backward into BI and W (default: only where the schedule
    needs it, ``zb-h1``).
    ``batch_weight_grads``: each backward is a BI and one ``W(-1)`` right before each update of
    the stage computes the weight gradients of all of them (batched); ignored by schedules that
    do not honour it (``dp``: its all-reduce runs inside the backward; ``zb-h1``: its W are
    placed one by one).
    ``per_update``: asynchronous schedules only, microbatches per weight update (one batch); 1 is
    PipeDream's original, one update per minibatch; their ``meta["per_update"]`` says it (a sync
    schedule updates once per iteration).
    """
    if not registry.known(name):
        raise ScheduleError(f"schedule must be one of {', '.join(registry.names())}; got {name!r}")
    spec = registry.get(name)
    if microbatches < 1:
        raise ScheduleError(f"microbatches must be >= 1, got {microbatches}")
    if chunks < 1:
        raise ScheduleError(f"chunks must be >= 1, got {chunks}")
    if spec.chunks and chunks == 1:  # as the runtime's layout does: a run asking for 1 gets the default
        chunks = spec.default_chunks
    physical = 1 if spec.data_parallel else num_stages
    units = physical * chunks * microbatches
    if units > MAX_UNITS:
        raise ScheduleError(
            f"microbatches x stages x chunks = {units} is more than this builder handles ({MAX_UNITS})"
        )
    if chunks > 1 and not spec.chunks:
        raise ScheduleError(f"chunks > 1 needs schedule {registry.either(registry.having(chunks=True))}, not {name!r}")
    if per_update != 1 and spec.synchronous:
        raise ScheduleError(f"per_update (microbatches per weight update) applies to schedule "
                            f"{registry.either(registry.having(synchronous=False))} only; "
                            f"{name!r} updates once per iteration of its microbatches")
    if vertical_sync and not spec.vertical_sync:
        raise ScheduleError(f"vertical_sync applies to schedule {registry.either(registry.having(vertical_sync=True))} only")
    split = spec.needs_split_backward if split_backward is None else bool(split_backward)
    if spec.needs_split_backward and not split:
        raise ScheduleError(f"{name} needs split_backward (its point is running W apart from BI)")
    batch = bool(batch_weight_grads) and "batched" in spec.weight_grads
    if batch and split:
        raise ScheduleError("batch_weight_grads and split_backward exclude each other: "
                            "the weight gradients are either batched before the update or run one by one")

    topo = _topology(spec, num_stages, replicas, chunks)
    ctx = BuildContext(topo, microbatches, physical, chunks, split, vertical_sync, per_update)
    with gc_paused():
        programs = spec.builder(ctx)
        if len(programs) != topo.num_workers:
            raise ScheduleError(f"{name}: the builder wrote {len(programs)} programs for {topo.num_workers} workers")
        programs, pairs = _expand_pairs(name, programs, topo)
        if batch:
            programs = [batch_weights(p) for p in programs]
        table = hoist_receives(place(topo, programs))
    meta = {
        "sync": spec.synchronous,
        "physical_stages": physical,
        "chunks": chunks,
        "placement": spec.placement,
        "replicas": [topo.replicas(s) for s in range(topo.num_stages)] if chunks == 1 else [1] * num_stages,
        "split_backward": split,
        "batch_weight_grads": batch,
        "vertical_sync": vertical_sync,
        "noam": [topo.noam(s) for s in range(topo.num_stages)] if chunks == 1 else None,
    }
    if not spec.synchronous:
        meta["per_update"] = per_update
    if any(pairs):
        meta["overlap_f_b"] = pairs
    return Schedule.from_columns(name, topo.num_stages, microbatches, list(topo.workers), table, meta)


def _topology(spec: ScheduleSpec, num_stages: int, replicas: list[int] | None, chunks: int) -> topo_mod.Topology:
    """The workers ``spec`` runs on: one replicated stage (data parallel), chunks placed as the
    spec declares over one worker per stage (chunks), else ``replicas[s]`` workers per stage."""
    if spec.data_parallel:
        if replicas is not None and len(replicas) != 1:
            raise ScheduleError(f"{spec.name} has one stage: replicas must be [workers], got {replicas}")
        return topo_mod.replicated(1, replicas if replicas is not None else [num_stages])
    if not spec.replication and replicas is not None and any(r != 1 for r in replicas):
        raise ScheduleError(f"{spec.name} does not replicate stages: replicas must all be 1")
    if spec.chunks:
        return topo_mod.interleaved(num_stages, chunks, spec.placement)
    return topo_mod.replicated(num_stages, replicas)


def _expand_pairs(name: str, programs: list[list], topo: topo_mod.Topology) -> tuple[list[list[Action]], list[list[list[int]]]]:
    """Each ``OverlapFB`` of a program as its forward then its backward, and per worker the
    pairs written (``meta["overlap_f_b"]``)."""
    out, pairs = [], []
    for w, program in enumerate(programs):
        if not any(isinstance(a, OverlapFB) for a in program):
            out.append(program)
            pairs.append([])
            continue
        flat: list[Action] = []
        mine: list[list[int]] = []
        held = set(topo.workers[w].stages)
        for a in program:
            if isinstance(a, OverlapFB):
                f, b = a.forward, a.backward
                if f.stage not in held or b.stage not in held:
                    raise ScheduleError(f"{name}: worker {w} pairs {a}, but holds stages {sorted(held)} only")
                flat += (f, b)
                mine.append([f.stage, f.microbatch, b.stage, b.microbatch])
            else:
                flat.append(a)
        out.append(flat)
        pairs.append(mine)
    return out, pairs
