"""One candidate's predicted step time and per-worker memory, by the trainer's one cost model.

Time: ``schedule.predict.stage_costs`` (the profile's per-layer forward, input- and weight-
gradient backward, batched W(-1), optimizer step, the link's transfers and all-reduce, the
runtime's calibrated overhead, the pilot runs) simulated in steady state by ``steady_step_s``,
as the service's ``simulate`` does. A recomputed stage reruns its forward in its backward, as
``schedule.predict.recomputed`` charges it, from its layers' forward time.

Memory: ``plan.memory_fit.plan_memory`` (``schedule.memory_model.worker_memory`` under the
schedule's own action order) for one worker per stage; for a schedule with chunks the same
formula over its virtual stages, each worker holding ``chunks`` of them.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from pipeboard.trainer.profile.calibration_records import Link
from pipeboard.trainer.profile.schema import Profile
from pipeboard.trainer.schedule import registry
from pipeboard.trainer.schedule import predict
from pipeboard.trainer.schedule.predict import (_schedule, kept_bytes, profile_overhead, recomputed, stage_costs,
                                                stage_output_bytes)


@lru_cache(maxsize=512)
def _built(schedule: str, p: int, microbatches: int, batches: int, replicas: tuple | None, batch_weight_grads: bool,
           chunks: int):
    # the candidates of one schedule, worker count and microbatch count share the action lists
    # (only their costs differ): built once, not once per split and recompute choice
    return _schedule(schedule, p, microbatches, batches, list(replicas) if replicas else None, batch_weight_grads,
                     chunks)


def _reused(schedule: str, p: int, microbatches: int, batches: int, replicas, batch_weight_grads: bool, chunks: int):
    return _built(schedule, p, microbatches, batches, tuple(replicas) if replicas else None, batch_weight_grads, chunks)


def steady_step_s(costs: list, schedule: str, microbatches: int, *, batch_weight_grads: bool,
                  replicas: list[int] | None, chunks: int, cores: int | None) -> float:
    """``schedule.predict.steady_step_s`` over schedules built once per shape (see ``_built``)."""
    # without bytes the simulator skips its memory model: predict_memory gives that, once
    costs = [replace(c, activation_bytes=0, weight_bytes=0, weight_grad_bytes=0, weight_input_bytes=0)
             for c in costs]
    return predict.steady_step_s(costs, schedule, microbatches, batch_weight_grads=batch_weight_grads,
                                 replicas=replicas, chunks=chunks, cores=cores, build_schedule=_reused)


def link_of(profile: Profile, bandwidth: float) -> Link:
    """The profile's measured link, else one at ``bandwidth`` bytes/s with no latency (what the
    planner is told): without one, transfers and all-reduces would count as free."""
    return profile.link if profile.link is not None else Link(latency_ms=0.0, bytes_per_ms=bandwidth / 1e3)


def predict_time(profile: Profile, split: dict[str, Any], schedule: str, microbatches: int, chunks: int,
                 recompute: list[bool], bandwidth: float) -> float:
    """Predicted seconds per step (``microbatches`` microbatches of the profile's batch size)."""
    stages = [st["layers"] for st in split["stages"]]
    replicas = [st["replicas"] for st in split["stages"]]
    link = link_of(profile, bandwidth)
    costs = stage_costs(profile, stages, microbatches=microbatches, link=link,
                        replicas=replicas if chunks == 1 else None, overhead=profile_overhead(profile, stages))
    if any(recompute):
        by_name = {layer.name: layer for layer in profile.layers}
        for k, on in enumerate(recompute):
            if on:
                extra = sum(by_name[n].forward_ms for n in stages[k]) / 1e3
                costs[k] = recomputed(costs[k], extra, first=k == 0)
    spec = registry.get(schedule)
    cores = profile.meta.get("cores") if isinstance(profile.meta.get("cores"), int) else None
    step = steady_step_s(costs, schedule, microbatches, batch_weight_grads="batched" in spec.weight_grads,
                         replicas=replicas if chunks == 1 else None, chunks=chunks, cores=cores)
    if profile.pilot is not None:  # what the pilots' steps took beyond their actions
        step *= profile.pilot.step_factor(sum(replicas) if chunks == 1 else len(stages) // chunks, cores,
                                          replicated=any(r > 1 for r in replicas),
                                          stages=len(stages) if chunks == 1 else len(stages) // chunks)
    return step


def optimizer_of(profile: Profile) -> str:
    from pipeboard.trainer.schedule.memory_model import OPTIMIZER_STATES

    name = str(profile.meta.get("optimizer") or "adam")
    return name if name in OPTIMIZER_STATES else "adam"


@lru_cache(maxsize=512)
def _memory_schedule(schedule: str, stages: int, microbatches: int, replicas: tuple | None, chunks: int):
    """(Schedule, its action columns) whose memory plan_memory reads, built once per shape."""
    from pipeboard.trainer.schedule.memory_model import run_schedule
    from pipeboard.trainer.schedule.stash import schedule_columns

    # what plan_memory builds: the schedule as a run builds it
    sched = run_schedule(schedule, stages // chunks, microbatches, replicas=list(replicas) if replicas else None,
                         chunks=chunks)
    return sched, schedule_columns(sched)[0]


def in_flight(longest: Profile, split: dict[str, Any]) -> dict[str, Any]:
    """``split`` with each stage's bytes kept per microbatch (``predict.kept_bytes``: activations
    in flight, what a weight pass keeps from BI to W) and ``activation_bytes_out`` what leaves it,
    all from ``longest`` (``Profile.at_longest``: the longest measured length, what memory must
    fit when lengths vary; the profile itself when it has one length). The stage activations the
    planner's split carries are outputs only."""
    stages = [st["layers"] for st in split["stages"]]
    outs = stage_output_bytes(longest, stages)
    by_name = {layer.name: layer for layer in longest.layers}
    filled = []
    for st, out in zip(split["stages"], outs):
        layers = [by_name[n] for n in st["layers"]]
        filled.append({**st, **kept_bytes(layers, out), "activation_bytes_out": int(out)})
    return {**split, "stages": filled}


def predict_memory(split: dict[str, Any], schedule: str, microbatches: int, chunks: int, recompute: list[bool],
                   optimizer: str) -> list[int]:
    """Predicted peak bytes per (virtual) stage, the fullest worker that holds it: plan_memory's
    formula (memory_model.worker_memory over memory_fit.stage_memory) on schedules built once per
    shape; with chunks, over the virtual stages (plan_memory knows one stage per worker)."""
    from pipeboard.trainer.plan.memory_fit import stage_memory
    from pipeboard.trainer.schedule.memory_model import worker_memory

    n = len(split["stages"])
    replicas = tuple(int(st["replicas"]) for st in split["stages"])
    sched, cols = _memory_schedule(schedule, n, microbatches, replicas if any(r > 1 for r in replicas) else None,
                                   chunks)
    workers = worker_memory(sched, stage_memory(split), optimizer=optimizer,
                            recompute=[s for s in range(n) if recompute[s]], cols=cols)
    best = [0] * n
    for spec, w in zip(sched.workers, workers):
        for s in spec.stages:
            best[s] = max(best[s], w.total)
    return best
